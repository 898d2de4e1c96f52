#!/usr/bin/env bash
# buf breaking against the previous commit of main (HEAD~1), or against AGAINST=<git rev>.
#
# buf cannot build the old tree straight from git: validate.proto is not committed (it is
# printed into .build/ at build time), so the old proto/ is exported into a scratch folder
# beside today's .build/protovalidate and compiled to an image first.
set -euo pipefail
cd "$(dirname "$0")/.."
buf=tools/node_modules/.bin/buf
against=${AGAINST:-HEAD~1}

if ! git rev-parse -q --verify "$against^{commit}" >/dev/null; then
  echo "buf breaking: no commit $against to compare with (first commit?); nothing to check"
  exit 0
fi
if ! git cat-file -e "$against:proto" 2>/dev/null; then
  echo "buf breaking: $against has no proto/ yet; nothing to check"
  exit 0
fi

old=$(mktemp -d)
trap 'rm -rf "$old"' EXIT
git archive "$against" proto buf.yaml | tar -x -C "$old"
mkdir -p "$old/.build"
cp -r .build/protovalidate "$old/.build/"
"$buf" build "$old" -o "$old/against.binpb"
# Compare image with image: the workspace has two modules, and buf refuses to compare a
# two-image input with a one-image against.
"$buf" build -o "$old/current.binpb"
"$buf" breaking "$old/current.binpb" --against "$old/against.binpb"
echo "buf breaking: no breaking change against $against ($(git rev-parse --short "$against"))"
