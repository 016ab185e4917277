/* Tiny test helpers shared by the C tests: CHECK aborts with the location and the
 * engine's last error message; brute-force reference joins with simjoin's arithmetic. */
#ifndef SIMJOIN_TEST_CHECK_H
#define SIMJOIN_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simjoin.h"

static inline void print_last_error(void) {
  char msg[512];
  simjoin_last_error_message(msg, sizeof msg);
  fprintf(stderr, "  last error: %s\n", msg);
}

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      print_last_error();                                                    \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define CHECK_OK(call) CHECK((call) == SIMJOIN_OK)

/* Deterministic pseudo-random numbers (splitmix64) in [0, 1). */
static uint64_t rng_state = 42;
static inline double next_uniform(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0;
}

/* The engine's match test (src/metric.rs): arithmetic in the input precision, dimensions
 * in order, Euclidean compares the squared distance with eps*eps rounded to the type. */
#define DEFINE_WITHIN(T, NAME)                                                    \
  static inline int NAME(simjoin_metric metric, const T *a, const T *b, size_t dim, double eps) { \
    T e = (T)eps, acc = 0;                                                        \
    T thr = metric == SIMJOIN_METRIC_EUCLIDEAN ? e * e : e;                       \
    size_t k;                                                                     \
    for (k = 0; k < dim; k++) {                                                   \
      T d = a[k] - b[k];                                                          \
      T ad = d < 0 ? -d : d;                                                      \
      if (metric == SIMJOIN_METRIC_EUCLIDEAN) acc = acc + d * d;                  \
      else if (metric == SIMJOIN_METRIC_MANHATTAN) acc = acc + ad;                \
      else acc = ad > acc ? ad : acc;                                             \
    }                                                                             \
    return acc <= thr;                                                            \
  }
DEFINE_WITHIN(float, within_f32)
DEFINE_WITHIN(double, within_f64)

/* Reference pairs of A join B (self_join: only i < j, b ignored), sorted, as 2*count u32. */
static inline uint32_t *reference_pairs(const simjoin_matrix *a, const simjoin_matrix *b, int self_join,
                                 simjoin_metric metric, double eps, size_t *count) {
  size_t cap = 16, n = 0, i, j, dim = a->cols;
  size_t rows_b = self_join ? a->rows : b->rows;
  uint32_t *out = malloc(cap * 2 * sizeof *out);
  CHECK(out != NULL);
  for (i = 0; i < a->rows; i++) {
    for (j = self_join ? i + 1 : 0; j < rows_b; j++) {
      const void *other = self_join ? a->data : b->data;
      int hit = a->dtype == SIMJOIN_DTYPE_F32
                    ? within_f32(metric, (const float *)a->data + i * dim,
                                 (const float *)other + j * dim, dim, eps)
                    : within_f64(metric, (const double *)a->data + i * dim,
                                 (const double *)other + j * dim, dim, eps);
      if (!hit) continue;
      if (n == cap) {
        cap *= 2;
        out = realloc(out, cap * 2 * sizeof *out);
        CHECK(out != NULL);
      }
      out[2 * n] = (uint32_t)i;
      out[2 * n + 1] = (uint32_t)j;
      n++;
    }
  }
  *count = n;
  return out;
}

static inline int compare_pairs(const void *x, const void *y) {
  const uint32_t *p = x, *q = y;
  if (p[0] != q[0]) return p[0] < q[0] ? -1 : 1;
  if (p[1] != q[1]) return p[1] < q[1] ? -1 : 1;
  return 0;
}

/* Sorts a copy of `pairs` and checks it equals the sorted `expected`. */
static inline void check_same_pairs(const uint32_t *pairs, size_t count, const uint32_t *expected,
                             size_t expected_count) {
  uint32_t *copy;
  CHECK(count == expected_count);
  if (count == 0) return;
  copy = malloc(count * 2 * sizeof *copy);
  CHECK(copy != NULL);
  memcpy(copy, pairs, count * 2 * sizeof *copy);
  qsort(copy, count, 2 * sizeof *copy, compare_pairs);
  CHECK(memcmp(copy, expected, count * 2 * sizeof *copy) == 0);
  free(copy);
}

#endif
