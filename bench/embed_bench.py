"""Cosine joins of embedding-like vectors (issue 40): simjoin against FAISS flat range
search (IndexFlatIP, exact brute force) and scikit-learn's radius_neighbors with
metric="cosine", same data, same threads, in one run; pairs as a NumPy array for every
system (the path a user takes). Prints a Markdown table with ratios.

Workloads (unit vectors; the structure is stated in each row's name):
- clusters: C random centres on the sphere, each vector a centre plus Gaussian noise of
  `spread` per coordinate, normalised (sizes and spreads vary per row);
- sphere: uniform on the sphere (no structure: simjoin's fallback is a blocked brute force);
- dups: clusters plus 1% planted near-duplicates (cosine >= 0.999 to another vector);
- lowdim: low intrinsic dimension without clusters: a Gaussian in m dimensions (the
  `centres` field) mapped linearly into D, plus noise of `spread` per coordinate.
eps is a cosine distance (1 - cos); each row's gives 1-100 neighbours per vector.
FAISS is run twice, IndexFlatIP and IndexFlatL2 (on the unit vectors, eps turned into a
squared Euclidean radius): both exact brute force.

    python3 bench/embed_bench.py [--quick | --large | --huge] [--threads N]
                                 [--knn | --dbscan] [--queries M]

--large: 100,000 vectors (clustered 384-D and 768-D) instead of the 20-50k rows; FAISS's
brute force then takes minutes a row on 2 cores. --huge: 1,000,000 clustered 384-D vectors
(10,000 and 30,000 centres), simjoin's join in full; FAISS's range search (hours on 2 cores) timed on the first 1% of
the queries against all the vectors and scaled by 100, said so in its column.
"""
import argparse
import os
import sys
import time

import numpy as np

# simjoin is imported by main(): bench/device/cosine.py imports this module's data alone.
simjoin = None

WORKLOADS = [
    # name, n, dim, centres, spread, eps
    ("clusters-128d", 50_000, 128, 1000, 0.03, 0.1),
    ("clusters-384d", 30_000, 384, 600, 0.016, 0.1),
    ("clusters-384d-wide", 30_000, 384, 300, 0.02, 0.15),
    ("clusters-768d", 20_000, 768, 400, 0.011, 0.1),
    ("dups-384d", 30_000, 384, 600, 0.03, 0.001),
    ("sphere-384d", 20_000, 384, 0, 0.0, 0.1),
    ("clusters-1024d", 20_000, 1024, 400, 0.0095, 0.1),
    ("lowdim-384d", 30_000, 384, 8, 0.002, 0.1),
    # Shaped like sentence embeddings (see `topics`): 50 topics, subtopic spread 0.3; about
    # 53 neighbours a vector at eps 0.03.
    ("topics-384d", 30_000, 384, 50, 0.3, 0.03),
]

# --large: the same structure at 100k vectors (2000 centres, about 50 vectors each).
LARGE = [
    ("clusters-384d-100k", 100_000, 384, 2000, 0.016, 0.1),
    ("clusters-768d-100k", 100_000, 768, 2000, 0.011, 0.1),
]

# --huge: 1M vectors, 10000 centres (about 100 vectors each, about 50 neighbours a vector);
# 30000 centres (about 33 each: more clusters than a leaders' sample of 16,384 meets).
HUGE = [
    ("clusters-384d-1m", 1_000_000, 384, 10_000, 0.016, 0.1),
    ("clusters-384d-1m-30k", 1_000_000, 384, 30_000, 0.016, 0.1),
]


def make(name, n, dim, centres, spread, seed=0):
    rng = np.random.default_rng(seed)
    if name.startswith("topics"):
        return topics(rng, n, dim, centres, spread)
    if name.startswith("lowdim"):
        w = rng.normal(size=(centres, dim))
        x = rng.normal(size=(n, centres)) @ w + spread * np.sqrt(centres) * rng.normal(size=(n, dim))
    elif centres == 0:
        x = rng.normal(size=(n, dim))
    else:
        c = rng.normal(size=(centres, dim))
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        x = c[rng.integers(0, centres, n)] + spread * rng.normal(size=(n, dim))
    if name.startswith("dups"):
        k = n // 100
        src = rng.integers(0, n, k)
        x[rng.integers(0, n, k)] = x[src] + 1e-3 * spread * rng.normal(size=(k, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x, dtype=np.float32)


def topics(rng, n, dim, count, spread, sub=20, dup=0.02):
    """A guess at the shape of sentence embeddings: a common mean direction (mean cosine
    about 0.19), a decaying spectrum (variance of direction i ~ 1/i, in random directions),
    `count` topics of `sub` subtopics (each `spread` from its topic) with power-law sizes,
    each vector's own noise log-uniform over 4x (tight and loose neighbourhoods), and
    `dup` of the vectors near-duplicates of others."""
    scale = 1.0 / np.sqrt(np.arange(1, dim + 1))
    basis = np.linalg.qr(rng.normal(size=(dim, dim)))[0]

    def draw(m, s):
        return (rng.normal(size=(m, dim)) * (s * scale)) @ basis.T

    mean = draw(1, 1.0)[0]
    mean /= np.linalg.norm(mean)
    t = draw(count, 1.0)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    st = np.repeat(t, sub, axis=0) + draw(count * sub, spread)
    st /= np.linalg.norm(st, axis=1, keepdims=True)
    w = 1.0 / np.arange(1, count * sub + 1) ** 0.8
    w = w[rng.permutation(len(w))]
    who = rng.choice(count * sub, n, p=w / w.sum())
    sigma = np.exp(rng.uniform(np.log(0.05), np.log(0.2), n))[:, None]
    x = 0.5 * mean + st[who] + sigma * draw(n, 1.0)
    k = int(dup * n)
    src = rng.integers(0, n, k)
    x[rng.integers(0, n, k)] = x[src] + 0.01 * draw(k, 1.0)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x, dtype=np.float32)


def timed(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def faiss_pairs(x, eps, threads, l2=False, queries=None):
    """FAISS flat range search of `queries` (default: all of x) against x: IP at 1 - eps,
    or L2 at the squared Euclidean radius 2 eps of unit vectors."""
    import faiss

    faiss.omp_set_num_threads(threads)
    q = x if queries is None else x[:queries]
    index = faiss.IndexFlatL2(x.shape[1]) if l2 else faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    lims, _, ids = index.range_search(q, 2.0 * eps if l2 else 1.0 - eps)
    rows = np.repeat(np.arange(len(q)), np.diff(lims).astype(np.int64))
    keep = rows < ids
    return np.stack([rows[keep], ids[keep]], axis=1)


def sklearn_pairs(x, eps, threads):
    from sklearn.neighbors import NearestNeighbors

    nn = NearestNeighbors(radius=eps, metric="cosine", algorithm="brute", n_jobs=threads).fit(x)
    g = nn.radius_neighbors_graph(x)
    r, c = g.nonzero()
    keep = r < c
    return np.stack([r[keep], c[keep]], axis=1)


def knn_rows(work, threads, k=10, m=None, scaled=False):
    """Cosine kNN (k nearest by 1 - cos, each vector's own row left out) against FAISS
    IndexFlatIP.search (k + 1, itself dropped): (name, n, dim, simjoin s, FAISS s, share of
    neighbour ids that agree). With `m`, the kNN of m vectors drawn at random (the same
    distribution) among the rest, FAISS's search of those queries; n is then the rest's.
    With `scaled` (a self-kNN), FAISS searches the first 1% of the vectors only, its time
    scaled by 100, and agreement is counted on those."""
    import faiss

    faiss.omp_set_num_threads(threads)
    out = []
    for name, n, dim, centres, spread, _ in work:
        x = make(name, n, dim, centres, spread)
        q = None
        if m:
            pick = np.random.default_rng(7).permutation(n)
            q, x, n = x[pick[:m]], x[pick[m:]], n - m
        sj_s, (_, ids) = timed(lambda: simjoin.knn(x, k, query=q, metric="cosine", threads=threads))
        part = n // 100 if scaled and q is None else None

        def flat():
            index = faiss.IndexFlatIP(dim)
            index.add(x)
            if q is not None:
                return index.search(q, k)[1]
            return index.search(x[:part] if part else x, k + 1)[1][:, 1:]

        fa_s, fids = timed(flat)
        if part:
            fa_s, ids = fa_s * n / part, ids[:part]
        out.append((name, n, dim, sj_s, fa_s, float(np.mean(fids == ids))))
        print(f"{name} kNN: simjoin {sj_s:.2f} s, FAISS {fa_s:.2f} s", file=sys.stderr, flush=True)
    return out


def dbscan_rows(work, threads, min_samples=5):
    """Cosine DBSCAN against scikit-learn's (metric="cosine", brute force, the same eps and
    min_samples): (name, n, dim, eps, clusters, simjoin s, scikit-learn s, share of points
    whose label agrees up to cluster numbering)."""
    from sklearn.cluster import DBSCAN

    out = []
    for name, n, dim, centres, spread, eps in work:
        x = make(name, n, dim, centres, spread)
        sj_s, mine = timed(lambda: simjoin.dbscan(x, eps, min_samples, metric="cosine", threads=threads))
        sk_s, model = timed(lambda: DBSCAN(eps=eps, min_samples=min_samples, metric="cosine",
                                           algorithm="brute", n_jobs=threads).fit(x))
        theirs = model.labels_
        # Labels agree up to numbering: map each of ours to the most common of theirs.
        agree = 0
        for c in np.unique(mine):
            sel = theirs[mine == c]
            if c < 0:
                agree += int(np.sum(sel < 0))
            else:
                vals, counts = np.unique(sel, return_counts=True)
                agree += int(counts.max()) if vals[counts.argmax()] >= 0 else 0
        clusters = int(mine.max()) + 1
        out.append((name, n, dim, eps, clusters, sj_s, sk_s, agree / n))
        print(f"{name} DBSCAN: simjoin {sj_s:.2f} s ({clusters} clusters), scikit-learn {sk_s:.2f} s",
              file=sys.stderr, flush=True)
    return out


def queries_rows(work, threads, m):
    """A ⋈ B, the search a user runs against a collection: `m` vectors drawn at random
    from the workload (the same distribution) against the rest, simjoin.join against FAISS
    IndexFlatIP.range_search of those queries: (name, queries, collection, dim, eps,
    pairs, FAISS count differs by, simjoin s, FAISS s)."""
    import faiss

    faiss.omp_set_num_threads(threads)
    out = []
    for name, n, dim, centres, spread, eps in work:
        x = make(name, n, dim, centres, spread)
        pick = np.random.default_rng(7).permutation(n)
        q, rest = x[pick[:m]], x[pick[m:]]
        sj_s, sj = timed(lambda: simjoin.join(q, rest, eps, metric="cosine", threads=threads))

        def flat():
            index = faiss.IndexFlatIP(dim)
            index.add(rest)
            return index.range_search(q, 1.0 - eps)[2]

        fa_s, ids = timed(flat)
        out.append((name, m, n - m, dim, eps, len(sj), abs(len(ids) - len(sj)), sj_s, fa_s))
        print(f"{name} {m} queries: simjoin {sj_s:.2f} s, FAISS {fa_s:.2f} s", file=sys.stderr, flush=True)
    return out


def main():
    global simjoin
    import simjoin

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the first two workloads, no scikit-learn")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--knn", action="store_true", help="cosine kNN (k = 10) instead of joins")
    ap.add_argument("--large", action="store_true", help="100k-vector workloads (minutes on 2 cores)")
    ap.add_argument("--huge", action="store_true", help="1M vectors (FAISS on 1%% of the queries, scaled)")
    ap.add_argument("--only", help="run only the workloads whose name contains this")
    ap.add_argument("--dbscan", action="store_true",
                    help="cosine DBSCAN (min_samples = 5) against scikit-learn's instead of joins")
    ap.add_argument("--queries", type=int, metavar="M",
                    help="A ⋈ B instead of self-joins (with --knn: the kNN of M queries): M vectors "
                         "of each workload against the rest")
    args = ap.parse_args()
    if args.only:
        keep = lambda ws: [w for w in ws if args.only in w[0]]  # noqa: E731
        WORKLOADS[:], LARGE[:], HUGE[:] = keep(WORKLOADS), keep(LARGE), keep(HUGE)
    if args.dbscan:
        work = LARGE if args.large else [
            w for w in WORKLOADS if w[0] in ("clusters-384d", "clusters-768d", "dups-384d", "sphere-384d")]
        print(f"{args.threads} threads for every system; seconds of one run, labels as NumPy arrays.\n")
        print("| workload | n | dims | eps (1 - cos) | clusters | simjoin s | scikit-learn s | scikit-learn / simjoin | labels agreeing |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, n, dim, eps, clusters, sj_s, sk_s, agree in dbscan_rows(work, args.threads):
            print(f"| {name} | {n:,} | {dim} | {eps} | {clusters} | {sj_s:.2f} | {sk_s:.2f} | "
                  f"{sk_s / sj_s:.1f}x | {agree:.4f} |")
        return
    if args.queries and not args.knn:
        work = LARGE if args.large else WORKLOADS
        print(f"{args.threads} threads for every system; seconds of one run, pairs as NumPy arrays.\n")
        print("| workload | queries | collection | dims | eps (1 - cos) | pairs | FAISS count differs by "
              "| simjoin s | FAISS IP s | FAISS / simjoin |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, m, rest, dim, eps, pairs, diff, sj_s, fa_s in queries_rows(work, args.threads, args.queries):
            print(f"| {name} | {m:,} | {rest:,} | {dim} | {eps} | {pairs:,} | {diff} | {sj_s:.2f} | {fa_s:.2f} "
                  f"| {fa_s / sj_s:.1f}x |")
        return
    if args.knn:
        work = HUGE if args.huge else LARGE if args.large else [
            w for w in WORKLOADS if w[0] in (
                "clusters-384d", "clusters-768d", "sphere-384d", "lowdim-384d", "dups-384d",
                "topics-384d")]
        print(f"{args.threads} threads for every system; seconds of one run, k = 10, ids as NumPy arrays"
              + (f"; {args.queries:,} queries drawn from each workload against the rest (n)" if args.queries else "")
              + ("; FAISS: the first 1% of the vectors' search, time x 100, ids compared on those"
                 if args.huge else "")
              + ".\n")
        print("| workload | n | dims | simjoin s | FAISS IP search s | FAISS / simjoin | ids agreeing |")
        print("|---|---|---|---|---|---|---|")
        for name, n, dim, sj_s, fa_s, agree in knn_rows(work, args.threads, m=args.queries,
                                                        scaled=args.huge):
            print(f"| {name} | {n:,} | {dim} | {sj_s:.2f} | {fa_s:.2f} | {fa_s / sj_s:.2f}x | {agree:.4f} |")
        return
    rows = []
    work = HUGE if args.huge else LARGE if args.large else WORKLOADS[:2] if args.quick else WORKLOADS
    for name, n, dim, centres, spread, eps in work:
        x = make(name, n, dim, centres, spread)
        sj_s, sj = timed(lambda: simjoin.self_join(x, eps, metric="cosine", threads=args.threads))
        # --huge: FAISS on the first 1% of the queries, scaled (its full run takes hours).
        part = n // 100 if args.huge else None
        scale = n / part if part else 1.0
        fa_s, fa = timed(lambda: faiss_pairs(x, eps, args.threads, queries=part))
        l2_s, l2 = timed(lambda: faiss_pairs(x, eps, args.threads, l2=True, queries=part))
        fa_s, l2_s = fa_s * scale, l2_s * scale
        sk_s = None
        if not args.quick and n <= 30_000:
            sk_s, _ = timed(lambda: sklearn_pairs(x, eps, args.threads))
        # FAISS compares f32 inner products: pairs within its rounding of eps may differ.
        # Scaled runs cover only some queries: compare with simjoin's pairs of those.
        mine = len(sj) if part is None else int(np.sum(sj[:, 0] < part))
        diff = max(abs(len(fa) - mine), abs(len(l2) - mine))
        rows.append((name, n, dim, eps, len(sj), diff, sj_s, fa_s, l2_s, sk_s))
        print(f"{name}: simjoin {len(sj)} pairs {sj_s:.2f} s, FAISS IP {len(fa)} pairs {fa_s:.2f} s, "
              f"L2 {len(l2)} pairs {l2_s:.2f} s" + (f", scikit-learn {sk_s:.2f} s" if sk_s else ""),
              file=sys.stderr, flush=True)
    print(f"{args.threads} threads for every system; seconds of one run, pairs as NumPy arrays."
          + (" FAISS: 1% of the queries, time x 100." if args.huge else "") + "\n")
    print("| workload | n | dims | eps (1 - cos) | pairs | FAISS count differs by | simjoin s | FAISS IP s "
          "| FAISS L2 s | scikit-learn s | FAISS IP / simjoin | FAISS L2 / simjoin | scikit-learn / simjoin |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, n, dim, eps, pairs, diff, sj_s, fa_s, l2_s, sk_s in rows:
        sk = f"{sk_s:.2f}" if sk_s else "-"
        skr = f"{sk_s / sj_s:.1f}x" if sk_s else "-"
        print(f"| {name} | {n:,} | {dim} | {eps} | {pairs:,} | {diff} | {sj_s:.2f} | {fa_s:.2f} | {l2_s:.2f} | "
              f"{sk} | {fa_s / sj_s:.1f}x | {l2_s / sj_s:.1f}x | {skr} |")


if __name__ == "__main__":
    main()
