/* Self-join through the C ABI against a brute-force reference: f32 and f64, every metric,
 * every output form, uniform, clustered, duplicate and boundary data, n = 0, 1, 2. */
#include "check.h"

static simjoin_engine *engine;

static void run_case(const simjoin_matrix *m, simjoin_metric metric, double eps) {
  size_t want_count, count, rows, nnz, r, k;
  uint32_t *want = reference_pairs(m, NULL, 1, metric, eps, &want_count);
  simjoin_options opts;
  simjoin_result *res = NULL;
  const uint32_t *pairs;
  const uint64_t *offsets;
  const uint32_t *neighbors;
  simjoin_report report;

  CHECK_OK(simjoin_options_init(&opts));
  opts.eps = eps;
  opts.metric = metric;
  opts.backend = SIMJOIN_BACKEND_CPU;

  /* Pairs. */
  CHECK_OK(simjoin_self_join(engine, m, &opts, &res));
  CHECK(simjoin_result_output(res) == SIMJOIN_OUTPUT_PAIRS);
  CHECK_OK(simjoin_result_pairs(res, &pairs, &count));
  check_same_pairs(pairs, count, want, want_count);
  for (k = 0; k < count; k++) CHECK(pairs[2 * k] < pairs[2 * k + 1]);
  CHECK(simjoin_result_count(res) == want_count);
  CHECK_OK(simjoin_result_report(res, &report));
  CHECK(report.pairs == want_count);
  CHECK(strcmp(report.backend, "cpu") == 0);
  CHECK(report.algorithm != SIMJOIN_ALGORITHM_AUTO);
  CHECK(report.seconds >= 0.0);
  simjoin_result_free(res);

  /* Sorted pairs come out exactly as the (sorted) reference. */
  opts.sorted = 1;
  CHECK_OK(simjoin_self_join(engine, m, &opts, &res));
  CHECK_OK(simjoin_result_pairs(res, &pairs, &count));
  CHECK(count == want_count);
  CHECK(count == 0 || memcmp(pairs, want, count * 2 * sizeof *pairs) == 0);
  simjoin_result_free(res);

  /* CSR: both directions, rows sorted; every pair (i, j) appears in row i and row j. */
  opts.output = SIMJOIN_OUTPUT_CSR;
  CHECK_OK(simjoin_self_join(engine, m, &opts, &res));
  CHECK_OK(simjoin_result_csr(res, &offsets, &rows, &neighbors, &nnz));
  CHECK(rows == m->rows);
  CHECK(offsets[0] == 0 && offsets[rows] == nnz);
  CHECK(nnz == 2 * want_count);
  for (k = 0; k < want_count; k++) {
    uint32_t i = want[2 * k], j = want[2 * k + 1];
    int found_j = 0, found_i = 0;
    uint64_t e;
    for (e = offsets[i]; e < offsets[i + 1]; e++) found_j |= neighbors[e] == j;
    for (e = offsets[j]; e < offsets[j + 1]; e++) found_i |= neighbors[e] == i;
    CHECK(found_i && found_j);
  }
  for (r = 0; r < rows; r++)
    for (k = offsets[r] + 1; k < offsets[r + 1]; k++) CHECK(neighbors[k - 1] < neighbors[k]);
  CHECK(simjoin_result_pairs(res, &pairs, &count) == SIMJOIN_INVALID_ARGUMENT);
  simjoin_result_free(res);

  /* Count. */
  opts.output = SIMJOIN_OUTPUT_COUNT;
  CHECK_OK(simjoin_self_join(engine, m, &opts, &res));
  CHECK(simjoin_result_output(res) == SIMJOIN_OUTPUT_COUNT);
  CHECK(simjoin_result_count(res) == want_count);
  simjoin_result_free(res);
  free(want);
}

static void run_all_metrics(const simjoin_matrix *m, double eps) {
  run_case(m, SIMJOIN_METRIC_EUCLIDEAN, eps);
  run_case(m, SIMJOIN_METRIC_MANHATTAN, eps);
  run_case(m, SIMJOIN_METRIC_CHEBYSHEV, eps);
}

int main(void) {
  enum { N = 400, DIM = 3 };
  static float uniform[N * DIM], boundary[N * 2];
  static double clustered[N * 5];
  size_t i, k, n;
  simjoin_matrix m;

  CHECK_OK(simjoin_engine_new(&engine));

  /* Uniform f32 in the unit cube, with some exact duplicates. */
  for (i = 0; i < N * DIM; i++) uniform[i] = (float)next_uniform();
  for (i = 0; i < 20; i++) memcpy(&uniform[(N - 1 - i) * DIM], &uniform[i * DIM], DIM * sizeof(float));
  m.data = uniform; m.rows = N; m.cols = DIM; m.dtype = SIMJOIN_DTYPE_F32;
  run_all_metrics(&m, 0.1);

  /* Clustered f64 in 5-D: 8 tight clusters. */
  for (i = 0; i < N; i++) {
    int c = (int)(next_uniform() * 8);
    for (k = 0; k < 5; k++) clustered[i * 5 + k] = c * 10.0 + next_uniform() * 0.5;
  }
  m.data = clustered; m.rows = N; m.cols = 5; m.dtype = SIMJOIN_DTYPE_F64;
  run_all_metrics(&m, 0.3);

  /* Boundary: an integer lattice scaled by eps = 0.5, so neighbours are exactly eps apart
   * (and diagonals exactly eps*sqrt(2)), all exactly representable. */
  for (i = 0; i < N; i++) {
    boundary[2 * i] = (float)(i % 20) * 0.5f;
    boundary[2 * i + 1] = (float)(i / 20) * 0.5f;
  }
  m.data = boundary; m.rows = N; m.cols = 2; m.dtype = SIMJOIN_DTYPE_F32;
  run_all_metrics(&m, 0.5);

  /* Tiny inputs: n = 0 (data may be NULL), 1 and 2 (exactly eps apart). */
  for (n = 0; n <= 2; n++) {
    m.data = n == 0 ? NULL : (const void *)boundary; m.rows = n; m.cols = 2;
    m.dtype = SIMJOIN_DTYPE_F32;
    run_all_metrics(&m, 0.5);
  }

  simjoin_engine_free(engine);
  printf("self-join: ok\n");
  return 0;
}
