#!/usr/bin/env bash
# Exports a commit (default HEAD) into .gpu-tree/ (git-ignored via
# .git/info/exclude), with .deps/ beside it, so a device run can build exactly
# that commit while the working tree holds unfinished edits:
#   scripts/gpu_tree.sh [REV] [--base BASE_REV] [--alt ALT_REV]...
#   scripts/gpu_tree.sh --working [--base BASE_REV]   the working tree as it is
#                                (tracked and untracked, not ignored files)
#   device run: carry [".gpu-tree"], command: cd .gpu-tree && bash scripts/gpu_suite.sh all
# --base also exports BASE_REV into .gpu-tree/base/ for gpu_suite.sh's ab
# mode; each --alt (with --base) one more commit into .gpu-tree/alt/1, 2, ...,
# which ab builds and runs beside the tree and base (one call compares them all).
set -euo pipefail
cd "$(dirname "$0")/.."
REV=HEAD
BASE=""
ALTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE="$2"; shift 2 ;;
    --alt) ALTS+=("$2"); shift 2 ;;
    --working) REV=""; shift ;;
    *) REV="$1"; shift ;;
  esac
done
grep -qx "/.gpu-tree/" .git/info/exclude 2>/dev/null || echo "/.gpu-tree/" >> .git/info/exclude
rm -rf .gpu-tree && mkdir -p .gpu-tree
if [ -n "$REV" ]; then
  git archive "$REV" | tar -x -C .gpu-tree
  git rev-parse --short "$REV" > .gpu-tree/COMMIT
else
  git ls-files -co --exclude-standard | grep -v "^\.gpu-tree/" | tar -cf - -T - | tar -x -C .gpu-tree
  echo "$(git rev-parse --short HEAD)+working" > .gpu-tree/COMMIT
fi
if [ -n "$BASE" ]; then
  mkdir -p .gpu-tree/base
  git archive "$BASE" | tar -x -C .gpu-tree/base
  git rev-parse --short "$BASE" > .gpu-tree/base/COMMIT
fi
ALT_NAMES=""
for i in "${!ALTS[@]}"; do
  dir=".gpu-tree/alt/$((i + 1))"
  mkdir -p "$dir"
  git archive "${ALTS[$i]}" | tar -x -C "$dir"
  git rev-parse --short "${ALTS[$i]}" > "$dir/COMMIT"
  ALT_NAMES="$ALT_NAMES $(cat "$dir/COMMIT")"
done
# .deps: what the GPU machine lacks for the engine (nlohmann-json's headers and
# CMake package), made from this machine's Debian package when missing;
# without it gpu_suite.sh's build leaves the engine out.
if [ ! -d .deps ] && [ -d /usr/include/nlohmann ] && [ -d /usr/share/cmake/nlohmann_json ]; then
  grep -qx "/.deps/" .git/info/exclude 2>/dev/null || echo "/.deps/" >> .git/info/exclude
  mkdir -p .deps/include .deps/share/cmake
  cp -r /usr/include/nlohmann .deps/include/
  cp -r /usr/share/cmake/nlohmann_json .deps/share/cmake/
fi
if [ -d .deps ]; then
  cp -r .deps .gpu-tree/
else
  echo "gpu_tree: no .deps (nlohmann-json): the GPU build will leave the engine out" >&2
fi
echo "exported $(cat .gpu-tree/COMMIT) to .gpu-tree${BASE:+, base $(cat .gpu-tree/base/COMMIT)}${ALT_NAMES:+, alt$ALT_NAMES}"
