/* Streaming joins through the C ABI: the chunks a callback receives add up to exactly the
 * reference pair set; a callback that returns non-zero stops the join with CANCELLED. */
#include "check.h"

typedef struct collected {
  uint32_t *pairs;
  size_t count, cap, calls;
  size_t stop_after_calls; /* 0 = never stop */
} collected;

static int collect(void *user_data, const uint32_t *pairs, size_t count) {
  collected *c = user_data;
  c->calls++;
  if (c->stop_after_calls && c->calls >= c->stop_after_calls) return 1;
  if (c->count + count > c->cap) {
    c->cap = (c->count + count) * 2;
    c->pairs = realloc(c->pairs, c->cap * 2 * sizeof *c->pairs);
    CHECK(c->pairs != NULL);
  }
  if (count) memcpy(c->pairs + 2 * c->count, pairs, count * 2 * sizeof *pairs);
  c->count += count;
  return 0;
}

int main(void) {
  enum { N = 500 };
  static float points[N * 2], other[N * 2];
  size_t i, want_count;
  uint32_t *want;
  simjoin_engine *engine;
  simjoin_options opts;
  simjoin_matrix m, o;
  simjoin_result *res = NULL;
  collected c;
  simjoin_report report;
  char msg[256];

  for (i = 0; i < N * 2; i++) points[i] = (float)next_uniform();
  for (i = 0; i < N * 2; i++) other[i] = (float)next_uniform();
  m.data = points; m.rows = N; m.cols = 2; m.dtype = SIMJOIN_DTYPE_F32;
  o.data = other; o.rows = N; o.cols = 2; o.dtype = SIMJOIN_DTYPE_F32;
  CHECK_OK(simjoin_engine_new(&engine));
  CHECK_OK(simjoin_options_init(&opts));
  opts.eps = 0.05;

  /* Self-join stream. */
  memset(&c, 0, sizeof c);
  CHECK_OK(simjoin_self_join_stream(engine, &m, &opts, collect, &c, &res));
  want = reference_pairs(&m, NULL, 1, SIMJOIN_METRIC_EUCLIDEAN, opts.eps, &want_count);
  CHECK(want_count > 100);
  check_same_pairs(c.pairs, c.count, want, want_count);
  CHECK(simjoin_result_output(res) == SIMJOIN_OUTPUT_COUNT);
  CHECK(simjoin_result_count(res) == want_count);
  CHECK_OK(simjoin_result_report(res, &report));
  CHECK(report.pairs == want_count && report.batches >= 1);
  simjoin_result_free(res);
  free(want);
  free(c.pairs);

  /* A join B stream, without asking for the result handle. */
  memset(&c, 0, sizeof c);
  CHECK_OK(simjoin_join_stream(engine, &m, &o, &opts, collect, &c, NULL));
  want = reference_pairs(&m, &o, 0, SIMJOIN_METRIC_EUCLIDEAN, opts.eps, &want_count);
  check_same_pairs(c.pairs, c.count, want, want_count);
  free(want);
  free(c.pairs);

  /* Cancellation: the callback's first non-zero return stops the join; `out` untouched. */
  memset(&c, 0, sizeof c);
  c.stop_after_calls = 1;
  res = (simjoin_result *)&c; /* sentinel: must not be overwritten on failure */
  CHECK(simjoin_self_join_stream(engine, &m, &opts, collect, &c, &res) == SIMJOIN_CANCELLED);
  CHECK(res == (simjoin_result *)&c);
  if (c.calls != 1) fprintf(stderr, "calls = %zu\n", c.calls);
  CHECK(c.calls == 1);
  CHECK(simjoin_last_error_message(msg, sizeof msg) > 0);
  CHECK(strstr(msg, "callback") != NULL);
  free(c.pairs);

  simjoin_engine_free(engine);
  printf("stream: ok\n");
  return 0;
}
