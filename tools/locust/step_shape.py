"""Step load: hold each concurrency level for a fixed time, then move to the next; stop after the last.

Use it beside the locustfile (Locust picks up a shape class from any file given to -f):

    .venv/bin/locust -f tools/locust/locustfile.py,tools/locust/step_shape.py --headless \
        --host 127.0.0.1:8001 --spec-mode adaflash --step-users 1,2,4,8,16 --step-seconds 30 \
        --records out/steps.jsonl --csv out/steps --csv-full-history

Each level starts all its users at once (spawn rate = the level's size) and, going down, stops
the extra users. Requests running at a step down finish first (Locust's --stop-timeout applies to
them). The records of the locustfile carry `users`, the user count when each request started,
so a single run can be split by level afterwards. `adaflash sweep` does not use this shape: it
runs one Locust process per level and mode, so each level gets its own CSVs and a fresh start.
"""

from __future__ import annotations

from locust import LoadTestShape, events

from adaflash.cli_args import split_csv


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    g = parser.add_argument_group("step load", "the concurrency levels of step_shape.py")
    g.add_argument("--step-users", default="1,2,4,8,16,32,64", help="comma-separated user counts, in order")
    g.add_argument("--step-seconds", type=float, default=30.0, help="how long each level lasts")


def parse_levels(text: str) -> list[int]:
    levels = [int(x) for x in split_csv(text)]
    if not levels or min(levels) < 1:
        raise ValueError(f"--step-users needs positive user counts, got {text!r}")
    return levels


class StepLoadShape(LoadTestShape):
    """Levels from --step-users, each held for --step-seconds."""

    def tick(self) -> tuple[int, float] | None:
        opts = self.runner.environment.parsed_options
        levels = parse_levels(opts.step_users)
        step = int(self.get_run_time() // opts.step_seconds)
        if step >= len(levels):
            return None  # the last level is over: stop the test
        return levels[step], float(levels[step])
