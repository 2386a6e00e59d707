"""`adaflash-client`: one prompt to the `adaflash` Triton model, the text on stdout, statistics on stderr.

    adaflash-client "def fib(n):" --stream --spec-mode adaflash --max-tokens 64
    adaflash-client "def fib(n):" --json --stop "\\n\\n"
    adaflash-client "Name three primes." --chat --chat-kwargs '{"enable_thinking": false}'
    adaflash-client "def fib(n):" --url llm.example.com:8001 --ssl --root-cert ca.pem --header x-tenant=a

Exit status: 0 on success, 1 when the server (or the connection) reports an error, 2 for an
invalid argument, 130 when Ctrl-C cancelled the request.
"""

from __future__ import annotations

import argparse
import json
import sys

from adaflash_client.client import (
    SPEC_MODES,
    AdaFlashClient,
    Chunk,
    Completion,
    GenerationError,
    GenerationParams,
)
from adaflash_contract.cli_args import json_object
from adaflash_contract.connection import (
    add_connection_arguments,
    connection_argv,  # noqa: F401 - importable from here as before (the sweep)
    headers_from_args,
    tls_from_args,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="adaflash-client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt")
    p.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC endpoint, host:port")
    p.add_argument("--model-name", default="adaflash",
                   help="adaflash, or a model with TensorRT-LLM's tensors (a TensorRT-LLM ensemble: `ensemble`)")
    add_connection_arguments(p)
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, help="random seed (sent only when given)")
    p.add_argument("--spec-mode", choices=SPEC_MODES, help="speculation mode (default: the server's)")
    p.add_argument("--max-draft", type=int, help="most draft tokens per step (default: the server's)")
    p.add_argument("--stop", nargs="+", action="extend", metavar="WORD", help="stop words (repeatable)")
    p.add_argument("--chat", action="store_true",
                   help="the prompt is the user's message in the target's chat template (apply_chat_template)")
    p.add_argument("--messages", type=json.loads, help="with --chat: the turns before the prompt, a JSON list of "
                                                       '{"role": ..., "content": ...} (e.g. a system message)')
    p.add_argument("--chat-kwargs", type=json_object, help="with --chat: the template's switches, a JSON object")
    p.add_argument("--json", action="store_true", help="print one JSON object with text and statistics instead")
    return p.parse_args(argv)


def params_from_args(args: argparse.Namespace) -> GenerationParams:
    return GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, stop_words=args.stop, spec_mode=args.spec_mode,
                            max_draft=args.max_draft, apply_chat_template=args.chat or None, messages=args.messages,
                            chat_template_kwargs=args.chat_kwargs)


def stats(completion: Completion) -> dict:
    """The figures reported after a completion; times in milliseconds."""
    return {
        "tokens": completion.num_output_tokens,
        "target_forwards": completion.target_forwards,
        "tau": _round(completion.tau),
        "mean_accepted": _round(completion.mean_accepted_per_step),
        "ttft_ms": _round(_ms(completion.time_to_first_token_s)),
        "latency_ms": _round(_ms(completion.latency_s)),
        "tokens_per_s": _round(completion.tokens_per_s),
        "finish_reason": completion.finish_reason,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _print_chunk(chunk: Chunk) -> None:
    print(chunk.text, end="", flush=True)


def generate(client: AdaFlashClient, args: argparse.Namespace) -> Completion:
    """Run the request; with --stream (and without --json) the text is printed as it arrives."""
    params = params_from_args(args)
    if not args.stream:
        return client.generate(args.prompt, params)
    if args.json:
        return client.generate_streaming(args.prompt, params)
    try:
        return client.generate_streaming(args.prompt, params, on_chunk=_print_chunk)
    finally:
        print()  # end the streamed line, also before an error or "cancelled" on stderr


def report(completion: Completion, args: argparse.Namespace) -> None:
    figures = stats(completion)
    if args.json:
        print(json.dumps({"text": completion.text, **figures, "accepted_per_step": completion.accepted_per_step,
                          "draft_len_per_step": completion.draft_len_per_step}, ensure_ascii=False))
        return
    if not args.stream:
        print(completion.text)
    print(" ".join(f"{key}={'n/a' if value is None else value}" for key, value in figures.items()), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    args = parse_args(argv)
    with AdaFlashClient(args.url, model_name=args.model_name, tls=tls_from_args(args),
                        headers=headers_from_args(args)) as client:
        try:
            completion = generate(client, args)
        except GenerationError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("cancelled", file=sys.stderr)
            return 130
    report(completion, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
