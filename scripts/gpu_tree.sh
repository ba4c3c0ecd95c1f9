#!/usr/bin/env bash
# Exports a commit (default HEAD) into .gpu-tree/ (git-ignored via
# .git/info/exclude), with .deps/ beside it, so a device run can build exactly
# that commit while the working tree holds unfinished edits:
#   scripts/gpu_tree.sh [REV]
#   device run: carry [".gpu-tree"], command: cd .gpu-tree && bash scripts/gpu_suite.sh all
set -euo pipefail
cd "$(dirname "$0")/.."
REV="${1:-HEAD}"
grep -qx "/.gpu-tree/" .git/info/exclude 2>/dev/null || echo "/.gpu-tree/" >> .git/info/exclude
rm -rf .gpu-tree && mkdir -p .gpu-tree
git archive "$REV" | tar -x -C .gpu-tree
git rev-parse --short "$REV" > .gpu-tree/COMMIT
[ -d .deps ] && cp -r .deps .gpu-tree/
echo "exported $(cat .gpu-tree/COMMIT) to .gpu-tree"
