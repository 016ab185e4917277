/* The kNN join through the C ABI against a brute-force reference: self and A-to-B, f32 and
 * f64, every metric, ties on a lattice (equal distances go to the smaller index), options
 * NULL and set, errors (k = 0, k > candidates, NULL arguments), accessors with NULL
 * out-pointers. */
#include "check.h"

static simjoin_engine *engine;

typedef struct {
  double acc;
  uint32_t idx;
} cand;

static int cand_cmp(const void *x, const void *y) {
  const cand *a = x, *b = y;
  if (a->acc != b->acc) return a->acc < b->acc ? -1 : 1;
  return a->idx < b->idx ? -1 : (a->idx > b->idx);
}

/* Accumulator of the engine's metric (src/metric.rs), in double or float arithmetic. */
static double acc_of(const simjoin_matrix *m, size_t i, const simjoin_matrix *q, size_t r,
                     simjoin_metric metric) {
  size_t d;
  if (m->dtype == SIMJOIN_DTYPE_F64) {
    const double *x = (const double *)m->data + i * m->cols, *y = (const double *)q->data + r * q->cols;
    double acc = 0;
    for (d = 0; d < m->cols; d++) {
      double t = y[d] - x[d];
      if (metric == SIMJOIN_METRIC_EUCLIDEAN) acc = acc + t * t;
      else if (metric == SIMJOIN_METRIC_MANHATTAN) acc = acc + fabs(t);
      else acc = fabs(t) > acc ? fabs(t) : acc;
    }
    return acc;
  } else {
    const float *x = (const float *)m->data + i * m->cols, *y = (const float *)q->data + r * q->cols;
    float acc = 0;
    for (d = 0; d < m->cols; d++) {
      float t = y[d] - x[d];
      volatile float sq = t * t; /* no contraction into an FMA */
      if (metric == SIMJOIN_METRIC_EUCLIDEAN) acc = acc + sq;
      else if (metric == SIMJOIN_METRIC_MANHATTAN) acc = acc + fabsf(t);
      else acc = fabsf(t) > acc ? fabsf(t) : acc;
    }
    return acc;
  }
}

static void run_case(const simjoin_matrix *data, const simjoin_matrix *query, size_t k,
                     simjoin_metric metric) {
  const simjoin_matrix *q = query ? query : data;
  simjoin_knn_options opts;
  simjoin_knn_result *res = NULL;
  size_t rows, kk, r, c, n = data->rows;
  const uint32_t *idx;
  const void *dist;
  simjoin_dtype dtype;
  simjoin_report report;
  cand *all = malloc(n * sizeof *all);
  CHECK(all != NULL);

  CHECK_OK(simjoin_knn_options_init(&opts));
  opts.metric = metric;
  opts.backend = SIMJOIN_BACKEND_CPU;
  CHECK_OK(simjoin_knn(engine, data, query, k, &opts, &res));
  CHECK_OK(simjoin_knn_result_arrays(res, &rows, &kk, &idx, &dist, &dtype));
  CHECK(rows == q->rows && kk == k && dtype == data->dtype);
  CHECK_OK(simjoin_knn_result_report(res, &report));
  CHECK(report.pairs == rows * k && strcmp(report.backend, "cpu") == 0);
  /* auto on the CPU: the k-d tree, or the grid (up to 3-D, evenly spread points). */
  CHECK(report.algorithm == SIMJOIN_ALGORITHM_KDTREE || report.algorithm == SIMJOIN_ALGORITHM_GRID);
  for (r = 0; r < rows; r++) {
    size_t m = 0, i;
    for (i = 0; i < n; i++)
      if (query || i != r) {
        all[m].acc = acc_of(data, i, q, r, metric);
        all[m].idx = (uint32_t)i;
        m++;
      }
    qsort(all, m, sizeof *all, cand_cmp);
    for (c = 0; c < k; c++) {
      double want = metric == SIMJOIN_METRIC_EUCLIDEAN ? sqrt(all[c].acc) : all[c].acc;
      double got = dtype == SIMJOIN_DTYPE_F64 ? ((const double *)dist)[r * k + c]
                                              : ((const float *)dist)[r * k + c];
      if (dtype == SIMJOIN_DTYPE_F32) want = (float)want;
      CHECK(idx[r * k + c] == all[c].idx);
      CHECK(got == want);
    }
  }
  simjoin_knn_result_free(res);
  free(all);
}

int main(void) {
  enum { N = 400, NQ = 60, D = 3 };
  static double x64[N * D], q64[NQ * D];
  static float x32[N * D], lattice[100 * 2];
  size_t i, rows;
  simjoin_knn_result *res = NULL;
  simjoin_metric metrics[3] = {SIMJOIN_METRIC_EUCLIDEAN, SIMJOIN_METRIC_MANHATTAN,
                               SIMJOIN_METRIC_CHEBYSHEV};
  int m;
  CHECK(simjoin_abi_version() == SIMJOIN_ABI_VERSION);
  CHECK_OK(simjoin_engine_new(&engine));
  for (i = 0; i < N * D; i++) x32[i] = (float)(x64[i] = next_uniform());
  for (i = 0; i < NQ * D; i++) q64[i] = next_uniform();
  for (i = 0; i < 100; i++) {
    lattice[2 * i] = (float)(i % 10);
    lattice[2 * i + 1] = (float)(i / 10);
  }
  {
    simjoin_matrix d64 = {x64, N, D, SIMJOIN_DTYPE_F64}, dq = {q64, NQ, D, SIMJOIN_DTYPE_F64};
    simjoin_matrix d32 = {x32, N, D, SIMJOIN_DTYPE_F32}, lat = {lattice, 100, 2, SIMJOIN_DTYPE_F32};
    for (m = 0; m < 3; m++) {
      run_case(&d64, NULL, 1, metrics[m]);
      run_case(&d64, NULL, 16, metrics[m]);
      run_case(&d32, NULL, 10, metrics[m]);
      run_case(&d64, &dq, 25, metrics[m]);
      run_case(&d64, &dq, N, metrics[m]);
      run_case(&lat, NULL, 6, metrics[m]);
      run_case(&lat, NULL, 99, metrics[m]);
    }
    /* NULL options: defaults. NULL out-pointers in the accessor are skipped. */
    CHECK_OK(simjoin_knn(engine, &d64, NULL, 3, NULL, &res));
    CHECK_OK(simjoin_knn_result_arrays(res, &rows, NULL, NULL, NULL, NULL));
    CHECK(rows == N);
    simjoin_knn_result_free(res);
    /* Errors: k = 0, k > candidates (self: n - 1), mismatched dimensions, NULLs. */
    res = NULL;
    CHECK(simjoin_knn(engine, &d64, NULL, 0, NULL, &res) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_knn(engine, &d64, NULL, N, NULL, &res) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_knn(engine, &d64, &lat, 1, NULL, &res) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_knn(engine, NULL, NULL, 1, NULL, &res) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_knn(engine, &d64, NULL, 1, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(res == NULL);
    CHECK(simjoin_knn_result_arrays(NULL, &rows, NULL, NULL, NULL, NULL) ==
          SIMJOIN_INVALID_ARGUMENT);
    simjoin_knn_result_free(NULL);
  }
  simjoin_engine_free(engine);
  printf("test_knn: ok\n");
  return 0;
}
