#!/bin/sh
# Builds libsluicegate_native.so (an Envoy dynamic module: sluicegate_native.c) next to
# this script, or into the directory given as the first argument.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
exec gcc -O2 -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden \
    -o "$out/libsluicegate_native.so" "$here/sluicegate_native.c"
