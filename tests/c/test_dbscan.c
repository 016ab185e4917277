/* DBSCAN through the C ABI against a brute-force DBSCAN written here from the definition
 * (core: at least min_samples rows within eps, itself included; clusters: connected core
 * rows; border rows to the nearest core row, ties to the smaller row; clusters numbered by
 * their smallest row): f32 and f64, every metric, several min_samples, a lattice with
 * distances of exactly eps; a hand-checked case; options NULL and set; tiny inputs; errors
 * (eps <= 0 or NaN, min_samples 0, NaN coordinates, NULL arguments, unknown metric), with
 * the caller's arrays left untouched on failure. */
#include "check.h"

static simjoin_engine *engine;

/* Accumulated distance of the engine's metric (src/metric.rs) in the input precision. */
static double acc_of(const simjoin_matrix *m, size_t i, size_t j, simjoin_metric metric) {
  size_t d;
  if (m->dtype == SIMJOIN_DTYPE_F64) {
    const double *x = (const double *)m->data + i * m->cols, *y = (const double *)m->data + j * m->cols;
    double acc = 0;
    for (d = 0; d < m->cols; d++) {
      double t = x[d] - y[d];
      if (metric == SIMJOIN_METRIC_EUCLIDEAN) acc = acc + t * t;
      else if (metric == SIMJOIN_METRIC_MANHATTAN) acc = acc + fabs(t);
      else acc = fabs(t) > acc ? fabs(t) : acc;
    }
    return acc;
  } else {
    const float *x = (const float *)m->data + i * m->cols, *y = (const float *)m->data + j * m->cols;
    float acc = 0;
    for (d = 0; d < m->cols; d++) {
      float t = x[d] - y[d];
      volatile float sq = t * t; /* no contraction into an FMA */
      if (metric == SIMJOIN_METRIC_EUCLIDEAN) acc = acc + sq;
      else if (metric == SIMJOIN_METRIC_MANHATTAN) acc = acc + fabsf(t);
      else acc = fabsf(t) > acc ? fabsf(t) : acc;
    }
    return acc;
  }
}

static int near(const simjoin_matrix *m, size_t i, size_t j, simjoin_metric metric, double eps) {
  return m->dtype == SIMJOIN_DTYPE_F32
             ? within_f32(metric, (const float *)m->data + i * m->cols,
                          (const float *)m->data + j * m->cols, m->cols, eps)
             : within_f64(metric, (const double *)m->data + i * m->cols,
                          (const double *)m->data + j * m->cols, m->cols, eps);
}

/* The reference labels and core flags. */
static void reference(const simjoin_matrix *m, double eps, size_t min_samples,
                      simjoin_metric metric, int64_t *labels, uint8_t *core) {
  size_t n = m->rows, i, j, top;
  size_t *comp = malloc(n * sizeof *comp), *stack = malloc(n * sizeof *stack);
  size_t *number = malloc(n * sizeof *number), next = 0;
  unsigned char *adj = malloc(n * n);
  CHECK(comp && stack && number && adj);
  for (i = 0; i < n; i++) {
    size_t count = 1;
    for (j = 0; j < n; j++) {
      adj[i * n + j] = (unsigned char)(i != j && near(m, i < j ? i : j, i < j ? j : i, metric, eps));
      count += adj[i * n + j];
    }
    core[i] = (uint8_t)(count >= min_samples);
    comp[i] = (size_t)-1;
    number[i] = (size_t)-1;
  }
  for (i = 0; i < n; i++) {
    if (!core[i] || comp[i] != (size_t)-1) continue;
    comp[i] = i;
    stack[0] = i;
    top = 1;
    while (top > 0) {
      size_t p = stack[--top];
      for (j = 0; j < n; j++)
        if (adj[p * n + j] && core[j] && comp[j] == (size_t)-1) {
          comp[j] = i;
          stack[top++] = j;
        }
    }
  }
  for (i = 0; i < n; i++) {
    size_t owner = (size_t)-1;
    if (core[i]) {
      owner = comp[i];
    } else {
      size_t best = (size_t)-1;
      double best_acc = 0;
      for (j = 0; j < n; j++) {
        double a;
        if (!adj[i * n + j] || !core[j]) continue;
        a = acc_of(m, i, j, metric);
        if (best == (size_t)-1 || a < best_acc) { /* j ascends: ties keep the smaller */
          best = j;
          best_acc = a;
        }
      }
      if (best != (size_t)-1) owner = comp[best];
    }
    if (owner == (size_t)-1) {
      labels[i] = -1;
    } else {
      if (number[owner] == (size_t)-1) number[owner] = next++;
      labels[i] = (int64_t)number[owner];
    }
  }
  free(comp);
  free(stack);
  free(number);
  free(adj);
}

static void run_case(const simjoin_matrix *m, double eps, size_t min_samples,
                     simjoin_metric metric) {
  size_t n = m->rows, i, clusters = 0, noise = 0, cores = 0;
  int64_t *labels = malloc(n * sizeof *labels), *want = malloc(n * sizeof *want);
  uint8_t *core = malloc(n), *want_core = malloc(n);
  simjoin_dbscan_options opts;
  simjoin_dbscan_report report;
  CHECK(labels && want && core && want_core);
  CHECK_OK(simjoin_dbscan_options_init(&opts));
  opts.metric = metric;
  opts.backend = SIMJOIN_BACKEND_CPU;
  CHECK_OK(simjoin_dbscan(engine, m, eps, min_samples, &opts, labels, core, &report));
  reference(m, eps, min_samples, metric, want, want_core);
  for (i = 0; i < n; i++) {
    CHECK(labels[i] == want[i]);
    CHECK(core[i] == want_core[i]);
    if (labels[i] < 0) noise++;
    else if ((size_t)labels[i] + 1 > clusters) clusters = (size_t)labels[i] + 1;
    cores += core[i];
  }
  CHECK(report.clusters == clusters && report.noise == noise && report.core_points == cores);
  CHECK(strcmp(report.backend, "cpu") == 0 && report.seconds >= 0);
  /* Every CPU join algorithm gives the same labels. */
  {
    simjoin_algorithm algorithms[3] = {SIMJOIN_ALGORITHM_GRID, SIMJOIN_ALGORITHM_EGO,
                                       SIMJOIN_ALGORITHM_BRUTE};
    int a;
    for (a = 0; a < 3; a++) {
      opts.algorithm = algorithms[a];
      CHECK_OK(simjoin_dbscan(engine, m, eps, min_samples, &opts, labels, NULL, NULL));
      for (i = 0; i < n; i++) CHECK(labels[i] == want[i]);
    }
  }
  free(labels);
  free(want);
  free(core);
  free(want_core);
}

int main(void) {
  enum { N = 300, D = 3 };
  static double x64[N * D];
  static float x32[N * D], lattice[144 * 2];
  simjoin_metric metrics[3] = {SIMJOIN_METRIC_EUCLIDEAN, SIMJOIN_METRIC_MANHATTAN,
                               SIMJOIN_METRIC_CHEBYSHEV};
  size_t i, min_samples[4] = {1, 3, 5, 9};
  int m, s;
  CHECK(simjoin_abi_version() == SIMJOIN_ABI_VERSION);
  CHECK_OK(simjoin_engine_new(&engine));
  /* Three blobs plus uniform background noise. */
  for (i = 0; i < N; i++) {
    size_t d;
    for (d = 0; d < D; d++) {
      double v = i % 4 == 3 ? next_uniform() : (double)(i % 4) * 0.3 + 0.1 * next_uniform();
      x64[i * D + d] = v;
      x32[i * D + d] = (float)v;
    }
  }
  /* A 12 x 12 lattice of pitch 1 with holes: neighbours at exactly eps = 1. */
  for (i = 0; i < 144; i++) {
    lattice[2 * i] = (float)(i % 12) + (i % 7 == 0 ? 0.5f : 0.0f);
    lattice[2 * i + 1] = (float)(i / 12);
  }
  {
    simjoin_matrix d64 = {x64, N, D, SIMJOIN_DTYPE_F64}, d32 = {x32, N, D, SIMJOIN_DTYPE_F32};
    simjoin_matrix lat = {lattice, 144, 2, SIMJOIN_DTYPE_F32};
    for (m = 0; m < 3; m++)
      for (s = 0; s < 4; s++) {
        run_case(&d64, 0.08, min_samples[s], metrics[m]);
        run_case(&d32, 0.08, min_samples[s], metrics[m]);
        run_case(&lat, 1.0, min_samples[s], metrics[m]);
      }
  }
  {
    /* Hand-checked, 1-D, eps 1.5, min_samples 4: cores 3.0 (row 1) and 0.0 (row 2); 1.5
     * (row 6) is exactly 1.5 from both and goes to the smaller row's (row 1's) cluster,
     * which is cluster 1 because row 0 (-0.25, a border of 0.0) makes 0.0's cluster 0. */
    double x[7] = {-0.25, 3.0, 0.0, -0.5, 3.25, 3.5, 1.5};
    int64_t want[7] = {0, 1, 0, 0, 1, 1, 1}, labels[7];
    uint8_t core[7];
    simjoin_matrix h = {x, 7, 1, SIMJOIN_DTYPE_F64};
    simjoin_dbscan_report report;
    CHECK_OK(simjoin_dbscan(engine, &h, 1.5, 4, NULL, labels, core, &report));
    for (i = 0; i < 7; i++) {
      CHECK(labels[i] == want[i]);
      CHECK(core[i] == (i == 1 || i == 2));
    }
    CHECK(report.clusters == 2 && report.noise == 0 && report.core_points == 2);
    /* core and report are optional. */
    memset(labels, 0x55, sizeof labels);
    CHECK_OK(simjoin_dbscan(engine, &h, 1.5, 4, NULL, labels, NULL, NULL));
    CHECK(memcmp(labels, want, sizeof want) == 0);
    /* Errors leave the caller's arrays untouched. */
    memset(labels, 0x55, sizeof labels);
    CHECK(simjoin_dbscan(engine, &h, 0.0, 4, NULL, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_dbscan(engine, &h, -1.0, 4, NULL, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_dbscan(engine, &h, NAN, 4, NULL, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_dbscan(engine, &h, INFINITY, 4, NULL, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_dbscan(engine, &h, 1.5, 0, NULL, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_dbscan(engine, &h, 1.5, 4, NULL, NULL, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_dbscan(NULL, &h, 1.5, 4, NULL, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(simjoin_dbscan(engine, NULL, 1.5, 4, NULL, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    {
      simjoin_dbscan_options opts;
      CHECK_OK(simjoin_dbscan_options_init(&opts));
      opts.metric = 99;
      CHECK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
      opts.metric = SIMJOIN_METRIC_EUCLIDEAN;
      opts.algorithm = SIMJOIN_ALGORITHM_KDTREE; /* a kNN algorithm */
      CHECK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
      opts.algorithm = 77;
      CHECK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
      opts.algorithm = SIMJOIN_ALGORITHM_AUTO;
      opts.size = 0; /* not initialised */
      CHECK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    }
    x[3] = NAN;
    CHECK(simjoin_dbscan(engine, &h, 1.5, 4, NULL, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
    for (i = 0; i < sizeof labels; i++) CHECK(((unsigned char *)labels)[i] == 0x55);
    CHECK((simjoin_dbscan_options_init)(NULL) == SIMJOIN_INVALID_ARGUMENT);
  }
  {
    /* sample_weight on the hand-checked rows: unit weights give the same answer; row 6
     * weighing 4 is core by itself and joins both clusters; row 3 weighing -5 keeps rows 0
     * and 2 from being core, leaving row 1's cluster (rows 1, 4, 5, 6) and noise. A caller
     * built before the field existed (a smaller size) gets no weights. */
    double x[7] = {-0.25, 3.0, 0.0, -0.5, 3.25, 3.5, 1.5};
    double w[7] = {1, 1, 1, 1, 1, 1, 1};
    int64_t unit[7] = {0, 1, 0, 0, 1, 1, 1}, joined[7] = {0, 0, 0, 0, 0, 0, 0};
    int64_t negative[7] = {-1, 0, -1, -1, 0, 0, 0}, labels[7];
    uint8_t core[7];
    simjoin_matrix h = {x, 7, 1, SIMJOIN_DTYPE_F64};
    simjoin_dbscan_options opts;
    CHECK_OK(simjoin_dbscan_options_init(&opts));
    CHECK(opts.sample_weight == NULL);
    opts.sample_weight = w;
    CHECK_OK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, NULL, NULL));
    CHECK(memcmp(labels, unit, sizeof unit) == 0);
    w[6] = 4;
    CHECK_OK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, core, NULL));
    CHECK(memcmp(labels, joined, sizeof joined) == 0);
    CHECK(core[6] == 1 && core[1] == 1 && core[2] == 1 && core[0] == 0);
    w[6] = 1;
    w[3] = -5;
    CHECK_OK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, NULL, NULL));
    CHECK(memcmp(labels, negative, sizeof negative) == 0);
    opts.size = offsetof(simjoin_dbscan_options, sample_weight);
    CHECK_OK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, NULL, NULL));
    CHECK(memcmp(labels, unit, sizeof unit) == 0);
    opts.size = sizeof opts;
    w[3] = NAN;
    CHECK(simjoin_dbscan(engine, &h, 1.5, 4, &opts, labels, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
  }
  {
    /* 0, 1 and 2 rows. */
    float p[4] = {0, 0, 0.5f, 0};
    int64_t labels[2];
    simjoin_dbscan_report report;
    simjoin_matrix none = {NULL, 0, 2, SIMJOIN_DTYPE_F32}, one = {p, 1, 2, SIMJOIN_DTYPE_F32};
    simjoin_matrix two = {p, 2, 2, SIMJOIN_DTYPE_F32};
    CHECK_OK(simjoin_dbscan(engine, &none, 1.0, 5, NULL, NULL, NULL, &report));
    CHECK(report.clusters == 0 && report.noise == 0);
    CHECK_OK(simjoin_dbscan(engine, &one, 1.0, 1, NULL, labels, NULL, NULL));
    CHECK(labels[0] == 0);
    CHECK_OK(simjoin_dbscan(engine, &one, 1.0, 2, NULL, labels, NULL, NULL));
    CHECK(labels[0] == -1);
    CHECK_OK(simjoin_dbscan(engine, &two, 1.0, 2, NULL, labels, NULL, NULL));
    CHECK(labels[0] == 0 && labels[1] == 0);
    CHECK_OK(simjoin_dbscan(engine, &two, 0.4, 1, NULL, labels, NULL, NULL));
    CHECK(labels[0] == 0 && labels[1] == 1);
  }
  simjoin_engine_free(engine);
  printf("test_dbscan: ok\n");
  return 0;
}
