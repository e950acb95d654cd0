#!/usr/bin/env bash
# scripts/setup.sh builds what each of its users needs (issue 37): the README's first command
# (`setup.sh`, then `backprop train`) only the backprop program; `setup.sh --test` (scripts/test.sh,
# which then runs the whole suite from build/) every target. Both configure build/ alike, so the
# second only adds targets. Runs a copy of setup.sh with stand-ins for cmake, dpkg-query, apt-get and
# npm on PATH that record their arguments: nothing is installed or built. Seconds.
# Registered by cmake/packaging.cmake: setup_targets_test.sh (no arguments).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

mkdir -p "$tmp/repo/scripts" "$tmp/bin"
cp "$src/scripts/setup.sh" "$tmp/repo/scripts/"
for tool in cmake npm apt-get sudo; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls.log"\n' "$tool" "$tmp" > "$tmp/bin/$tool"
done
# Every package counts as installed: nothing to install.
printf '#!/bin/sh\nprintf "install ok installed"\n' > "$tmp/bin/dpkg-query"
chmod +x "$tmp"/bin/*

run_setup() {
  : > "$tmp/calls.log"
  PATH="$tmp/bin:$PATH" bash "$tmp/repo/scripts/setup.sh" "$@" || fail "setup.sh $* exited $?"
  cat "$tmp/calls.log"
}

echo "== setup.sh (the README's first command)"
first=$(run_setup)
echo "$first"
grep -q '^cmake -S \. -B build ' <<<"$first" || fail "setup.sh does not configure build/"
builds=$(grep '^cmake --build build' <<<"$first") || fail "setup.sh builds nothing"
[ "$(wc -l <<<"$builds")" = 1 ] || fail "setup.sh builds more than once: $builds"
grep -qE -- '--target backprop$' <<<"$builds" || fail "setup.sh builds more than backprop: $builds"
grep -qE '^(apt-get|sudo|npm) ' <<<"$first" && fail "setup.sh installed something though every package is there"

echo "== setup.sh --test (scripts/test.sh's first step)"
second=$(run_setup --test)
echo "$second"
builds=$(grep '^cmake --build build' <<<"$second") || fail "setup.sh --test builds nothing"
[ "$(wc -l <<<"$builds")" = 1 ] || fail "setup.sh --test builds more than once: $builds"
grep -q -- '--target' <<<"$builds" && fail "setup.sh --test builds only some targets, not all: $builds"
[ "$(grep '^cmake -S' <<<"$first")" = "$(grep '^cmake -S' <<<"$second")" ] ||
  fail "setup.sh and setup.sh --test configure build/ differently"
echo "OK"
