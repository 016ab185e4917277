/* A join B through the C ABI against a brute-force reference: f32 and f64, every metric,
 * pairs and CSR (rows are points of A), sizes 0, 1, 2 and a few hundred. */
#include "check.h"

static simjoin_engine *engine;

static void run_case(const simjoin_matrix *a, const simjoin_matrix *b, simjoin_metric metric,
                     double eps) {
  size_t want_count, count, rows, nnz, k;
  uint32_t *want = reference_pairs(a, b, 0, metric, eps, &want_count);
  simjoin_options opts;
  simjoin_result *res = NULL;
  const uint32_t *pairs;
  const uint64_t *offsets;
  const uint32_t *neighbors;

  CHECK_OK(simjoin_options_init(&opts));
  opts.eps = eps;
  opts.metric = metric;
  opts.backend = SIMJOIN_BACKEND_CPU;
  CHECK_OK(simjoin_join(engine, a, b, &opts, &res));
  CHECK_OK(simjoin_result_pairs(res, &pairs, &count));
  check_same_pairs(pairs, count, want, want_count);
  simjoin_result_free(res);

  /* CSR: row i lists the j with (i, j) a pair; rebuilt pairs equal the reference. */
  opts.output = SIMJOIN_OUTPUT_CSR;
  opts.sorted = 1;
  CHECK_OK(simjoin_join(engine, a, b, &opts, &res));
  CHECK_OK(simjoin_result_csr(res, &offsets, &rows, &neighbors, &nnz));
  CHECK(rows == a->rows && nnz == want_count && offsets[rows] == nnz);
  {
    size_t r, e = 0;
    uint32_t *rebuilt = malloc((nnz + 1) * 2 * sizeof *rebuilt);
    CHECK(rebuilt != NULL);
    for (r = 0; r < rows; r++)
      for (k = offsets[r]; k < offsets[r + 1]; k++, e++) {
        rebuilt[2 * e] = (uint32_t)r;
        rebuilt[2 * e + 1] = neighbors[k];
      }
    check_same_pairs(rebuilt, e, want, want_count);
    free(rebuilt);
  }
  simjoin_result_free(res);
  free(want);
}

int main(void) {
  enum { NA = 300, NB = 200 };
  static double a64[NA * 4], b64[NB * 4];
  static float a32[NA * 4], b32[NB * 4];
  size_t i, na, nb;
  simjoin_matrix a, b;
  simjoin_metric metric;

  CHECK_OK(simjoin_engine_new(&engine));
  for (i = 0; i < NA * 4; i++) a32[i] = (float)(a64[i] = next_uniform());
  for (i = 0; i < NB * 4; i++) b32[i] = (float)(b64[i] = next_uniform());
  /* Some points of B duplicate points of A; others sit exactly 0.25 from a point of A
   * along one axis (dyadic coordinates, so the distance is exact in both precisions). */
  for (i = 0; i < 10; i++) {
    a64[i * 4 + 3] = 0.125 * (double)i;
    a32[i * 4 + 3] = (float)a64[i * 4 + 3];
    memcpy(&b64[(10 + i) * 4], &a64[i * 4], 4 * sizeof(double));
    memcpy(&b32[(10 + i) * 4], &a32[i * 4], 4 * sizeof(float));
    b64[(10 + i) * 4 + 3] += 0.25;
    b32[(10 + i) * 4 + 3] += 0.25f;
    memcpy(&b64[i * 4], &a64[i * 4], 4 * sizeof(double));
    memcpy(&b32[i * 4], &a32[i * 4], 4 * sizeof(float));
  }

  for (metric = 0; metric <= SIMJOIN_METRIC_CHEBYSHEV; metric++) {
    a.data = a64; a.rows = NA; a.cols = 4; a.dtype = SIMJOIN_DTYPE_F64;
    b.data = b64; b.rows = NB; b.cols = 4; b.dtype = SIMJOIN_DTYPE_F64;
    run_case(&a, &b, metric, 0.25);
    a.data = a32; a.dtype = SIMJOIN_DTYPE_F32;
    b.data = b32; b.dtype = SIMJOIN_DTYPE_F32;
    run_case(&a, &b, metric, 0.25);
    /* Tiny and empty sides. */
    for (na = 0; na <= 2; na++)
      for (nb = 0; nb <= 2; nb++) {
        a.rows = na; b.rows = nb;
        run_case(&a, &b, metric, 0.5);
      }
  }
  simjoin_engine_free(engine);
  printf("join: ok\n");
  return 0;
}
