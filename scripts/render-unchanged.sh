#!/usr/bin/env bash
# Does a change leave every rendered file as it was? For each commit C given, render every
# shipped profile at C^ and at C (each in a throwaway worktree, so the checkout is untouched)
# and compare the files byte for byte: Dockerfile, version vector, checks, requirement files.
# A refactor that claims "no behaviour change" shows it here (issue 39).
#
#   scripts/render-unchanged.sh COMMIT...
#
# Renders with the environment as given, so MTP_SUBSTITUTE_BASE=... compares the real-stack
# renders on the stand-in base. Exit 1 when any commit changed a rendered byte (the files that
# differ are listed), 0 when none did.
set -u
cd "$(git rev-parse --show-toplevel)" || exit 2
PY=${PYTHON:-$PWD/.venv/bin/python}
work=$(mktemp -d /tmp/render-unchanged.XXXXXX)
trap 'git worktree prune; rm -rf "$work"' EXIT
profiles=$(find manifests/profiles -maxdepth 1 -name '*.yaml' ! -name base.yaml -printf '%f\n' | sed 's/\.yaml$//' | sort)
changed=0
for c in "$@"; do
  for side in parent this; do
    rev=$c; [ "$side" = parent ] && rev="$c^"
    git worktree add -q --detach "$work/wt" "$rev" || exit 2
    for p in $profiles; do
      (cd "$work/wt" && MTP_FASTPATH=0 "$PY" build.py render --profile "$p" --out "$work/$c/$side/$p" >/dev/null 2>"$work/err") \
        || echo "$rev: render $p failed: $(tail -1 "$work/err")"
    done
    git worktree remove --force "$work/wt"
  done
  n=$(find "$work/$c/this" -type f | wc -l)
  if diff -rq "$work/$c/parent" "$work/$c/this" >"$work/diff"; then
    echo "$c: identical ($n files over $(echo "$profiles" | wc -w) profiles)"
  else
    changed=1; echo "$c: CHANGED"; sed 's/^/  /' "$work/diff" | head -20
  fi
done
exit $changed
