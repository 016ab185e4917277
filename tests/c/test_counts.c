/* simjoin_neighbour_counts through the C ABI against a brute-force count written here
 * (rows within eps, the row itself included): f32 and f64, every metric, a lattice with
 * distances of exactly eps and duplicated rows; the pair count; tiny inputs; errors (NULL
 * options or counts, eps <= 0, NaN coordinates) leaving the caller's array untouched. */
#include "check.h"

static void check_counts(simjoin_engine *engine, const simjoin_matrix *m, double eps,
                         simjoin_metric metric) {
  size_t n = m->rows, i, j;
  uint32_t *got = malloc((n ? n : 1) * sizeof *got), *want = malloc((n ? n : 1) * sizeof *want);
  uint64_t pairs = 0, want_pairs = 0;
  simjoin_options opts;
  CHECK(got && want);
  for (i = 0; i < n; i++) want[i] = 1;
  for (i = 0; i < n; i++)
    for (j = i + 1; j < n; j++) {
      int near = m->dtype == SIMJOIN_DTYPE_F32
                     ? within_f32(metric, (const float *)m->data + i * m->cols,
                                  (const float *)m->data + j * m->cols, m->cols, eps)
                     : within_f64(metric, (const double *)m->data + i * m->cols,
                                  (const double *)m->data + j * m->cols, m->cols, eps);
      if (near) {
        want[i]++;
        want[j]++;
        want_pairs++;
      }
    }
  CHECK_OK(simjoin_options_init(&opts));
  opts.eps = eps;
  opts.metric = metric;
  CHECK_OK(simjoin_neighbour_counts(engine, m, &opts, got, &pairs));
  for (i = 0; i < n; i++) CHECK(got[i] == want[i]);
  CHECK(pairs == want_pairs);
  free(got);
  free(want);
}

int main(void) {
  simjoin_engine *engine = NULL;
  float lattice[2 * 64];
  double rows[3 * 300];
  simjoin_matrix m;
  simjoin_options opts;
  uint32_t counts[4] = {7, 7, 7, 7};
  size_t i;
  int metric;
  CHECK_OK(simjoin_engine_new(&engine));

  /* An 8 x 8 lattice of pitch 0.5 (exact eps distances), rows 56..63 copies of row 0. */
  for (i = 0; i < 64; i++) {
    lattice[2 * i] = i < 56 ? (float)(i % 8) * 0.5f : 0.0f;
    lattice[2 * i + 1] = i < 56 ? (float)(i / 8) * 0.5f : 0.0f;
  }
  m = (simjoin_matrix){lattice, 64, 2, SIMJOIN_DTYPE_F32};
  for (metric = 0; metric < 3; metric++) check_counts(engine, &m, 0.5, (simjoin_metric)metric);

  for (i = 0; i < 3 * 300; i++) rows[i] = next_uniform();
  m = (simjoin_matrix){rows, 300, 3, SIMJOIN_DTYPE_F64};
  for (metric = 0; metric < 3; metric++) check_counts(engine, &m, 0.12, (simjoin_metric)metric);

  /* Tiny inputs: no row, one row (it counts itself). */
  m = (simjoin_matrix){rows, 0, 3, SIMJOIN_DTYPE_F64};
  check_counts(engine, &m, 0.1, SIMJOIN_METRIC_EUCLIDEAN);
  m = (simjoin_matrix){rows, 1, 3, SIMJOIN_DTYPE_F64};
  check_counts(engine, &m, 0.1, SIMJOIN_METRIC_EUCLIDEAN);

  /* Errors leave the counts untouched. */
  m = (simjoin_matrix){rows, 4, 3, SIMJOIN_DTYPE_F64};
  CHECK(simjoin_neighbour_counts(engine, &m, NULL, counts, NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK_OK(simjoin_options_init(&opts));
  opts.eps = 0.1;
  CHECK(simjoin_neighbour_counts(engine, &m, &opts, NULL, NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_neighbour_counts(NULL, &m, &opts, counts, NULL) == SIMJOIN_INVALID_ARGUMENT);
  opts.eps = 0.0;
  CHECK(simjoin_neighbour_counts(engine, &m, &opts, counts, NULL) == SIMJOIN_INVALID_ARGUMENT);
  opts.eps = 0.1;
  rows[4] = NAN;
  CHECK(simjoin_neighbour_counts(engine, &m, &opts, counts, NULL) == SIMJOIN_INVALID_ARGUMENT);
  for (i = 0; i < 4; i++) CHECK(counts[i] == 7);

  simjoin_engine_free(engine);
  puts("test_counts: ok");
  return 0;
}
