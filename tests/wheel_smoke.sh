#!/usr/bin/env bash
# The wheel a user installs without Rust (scripts/build-wheel.sh), installed into a fresh
# virtual environment whose PATH has no cargo, then a join, a kNN and a DBSCAN from it
# checked against scipy's cKDTree and scikit-learn. Prints how long the install took.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
wheel=$(bash scripts/build-wheel.sh "$root/target/wheel" | tail -1)
tmp=$(mktemp -d /tmp/simjoin-wheel-smoke.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# Rust's own directories off the PATH, and binary packages only: nothing is built.
export PATH=/usr/local/bin:/usr/bin:/bin
if command -v cargo >/dev/null; then
  echo "-- note: cargo is installed system-wide ($(command -v cargo)); --only-binary keeps pip from building"
fi
python3 -m venv "$tmp/venv"
start=$(date +%s%N)
"$tmp/venv/bin/pip" install -q --only-binary=:all: "$wheel"
echo "-- pip install of $(basename "$wheel") ($(du -h "$wheel" | cut -f1)): $(( ($(date +%s%N) - start) / 1000000 )) ms"
"$tmp/venv/bin/pip" install -q --only-binary=:all: scikit-learn
cd "$tmp"
"$tmp/venv/bin/python" - <<'PY'
import numpy as np
from scipy.spatial import cKDTree
from sklearn.cluster import DBSCAN
from sklearn.neighbors import NearestNeighbors

import simjoin

rng = np.random.default_rng(0)
X = rng.random((5000, 3))
pairs = simjoin.self_join(X, 0.03)
want = cKDTree(X).query_pairs(0.03, output_type="ndarray")
assert sorted(map(tuple, pairs.tolist())) == sorted(map(tuple, want.tolist())), "join"
dist, idx = simjoin.knn(X, 5)
d2, i2 = NearestNeighbors(n_neighbors=6).fit(X).kneighbors(X)
assert np.allclose(dist, d2[:, 1:]), "knn"
labels = simjoin.dbscan(X, 0.03, 5)
ref = DBSCAN(eps=0.03, min_samples=5).fit_predict(X)
assert ((labels < 0) == (ref < 0)).all(), "dbscan noise"
print(f"wheel smoke test: simjoin {simjoin.__version__}: {len(pairs)} pairs, kNN and DBSCAN agree with scipy and scikit-learn")
PY
