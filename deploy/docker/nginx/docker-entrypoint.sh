#!/bin/sh
# As the nginx image's entrypoint does: each /etc/nginx/templates/NAME.template, with the environment's variables
# substituted (only those defined: nginx's own $variables stay), becomes /etc/nginx/conf.d/NAME; then the command.
set -eu
for template in /etc/nginx/templates/*.template; do
    [ -f "$template" ] || continue
    defined=$(awk 'END { for (name in ENVIRON) printf "${%s} ", name }' </dev/null)
    output="/etc/nginx/conf.d/$(basename "$template" .template)"
    envsubst "$defined" <"$template" >"$output"
    echo "$0: $template -> $output"
done
exec "$@"
