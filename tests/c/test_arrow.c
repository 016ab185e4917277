/* The Arrow C stream export (simjoin_self_join_arrow / simjoin_join_arrow) consumed from C
 * through the Arrow C data interface's structs: every batch's i, j columns together are
 * the join's pair set (count and checksum against simjoin_self_join), distances present
 * when asked, a consumer that releases the stream early stops the join; run under ASan by
 * the asan variant. */
#include "check.h"

/* The Arrow C data interface (https://arrow.apache.org/docs/format/CDataInterface.html). */
struct ArrowSchema {
  const char *format, *name, *metadata;
  int64_t flags, n_children;
  struct ArrowSchema **children, *dictionary;
  void (*release)(struct ArrowSchema *);
  void *private_data;
};
struct ArrowArray {
  int64_t length, null_count, offset, n_buffers, n_children;
  const void **buffers;
  struct ArrowArray **children, *dictionary;
  void (*release)(struct ArrowArray *);
  void *private_data;
};
struct ArrowArrayStream {
  int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *);
  int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *);
  const char *(*get_last_error)(struct ArrowArrayStream *);
  void (*release)(struct ArrowArrayStream *);
  void *private_data;
};

static void checksum(const uint32_t *pairs, size_t count, uint64_t *sum) {
  size_t e;
  for (e = 0; e < count; e++) *sum += (uint64_t)pairs[2 * e] * 1000003u + pairs[2 * e + 1];
}

int main(void) {
  enum { N = 4000 };
  static double pts[N * 2];
  simjoin_engine *engine;
  simjoin_options opts;
  simjoin_result *res;
  struct ArrowArrayStream stream;
  struct ArrowSchema schema;
  struct ArrowArray batch;
  const uint32_t *pairs;
  size_t count, i;
  uint64_t want = 0, got = 0, rows = 0;
  simjoin_matrix m = {pts, N, 2, SIMJOIN_DTYPE_F64};
  for (i = 0; i < N * 2; i++) pts[i] = next_uniform();
  CHECK_OK(simjoin_engine_new(&engine));
  CHECK_OK(simjoin_options_init(&opts));
  opts.eps = 0.03;
  opts.backend = SIMJOIN_BACKEND_CPU;
  CHECK_OK(simjoin_self_join(engine, &m, &opts, &res));
  CHECK_OK(simjoin_result_pairs(res, &pairs, &count));
  checksum(pairs, count, &want);
  simjoin_result_free(res);

  opts.distances = 1;
  CHECK_OK(simjoin_self_join_arrow(engine, &m, &opts, &stream));
  CHECK(stream.get_schema(&stream, &schema) == 0);
  CHECK(schema.n_children == 3 && strcmp(schema.format, "+s") == 0);
  CHECK(strcmp(schema.children[0]->name, "i") == 0 && strcmp(schema.children[0]->format, "I") == 0);
  CHECK(strcmp(schema.children[2]->name, "distance") == 0 && strcmp(schema.children[2]->format, "g") == 0);
  schema.release(&schema);
  for (;;) {
    int64_t r;
    const uint32_t *ci, *cj;
    const double *cd;
    CHECK(stream.get_next(&stream, &batch) == 0);
    if (batch.release == NULL) break; /* end of stream */
    CHECK(batch.n_children == 3);
    ci = (const uint32_t *)batch.children[0]->buffers[1] + batch.children[0]->offset;
    cj = (const uint32_t *)batch.children[1]->buffers[1] + batch.children[1]->offset;
    cd = (const double *)batch.children[2]->buffers[1] + batch.children[2]->offset;
    for (r = 0; r < batch.length; r++) {
      double dx = pts[2 * ci[r]] - pts[2 * cj[r]], dy = pts[2 * ci[r] + 1] - pts[2 * cj[r] + 1];
      CHECK(ci[r] < cj[r]);
      CHECK(cd[r] == sqrt(dx * dx + dy * dy));
      got += (uint64_t)ci[r] * 1000003u + cj[r];
    }
    rows += (uint64_t)batch.length;
    batch.release(&batch);
  }
  stream.release(&stream);
  CHECK(rows == count && got == want);

  /* Released after one batch: the join stops, nothing leaks (ASan). */
  opts.distances = 0;
  opts.eps = 0.2;
  CHECK_OK(simjoin_self_join_arrow(engine, &m, &opts, &stream));
  CHECK(stream.get_next(&stream, &batch) == 0 && batch.release != NULL);
  batch.release(&batch);
  stream.release(&stream);
  /* Errors: bad eps at the call, NULL out. */
  opts.eps = -1;
  CHECK(simjoin_self_join_arrow(engine, &m, &opts, &stream) == SIMJOIN_INVALID_ARGUMENT);
  opts.eps = 0.1;
  CHECK(simjoin_self_join_arrow(engine, &m, &opts, NULL) == SIMJOIN_INVALID_ARGUMENT);
  simjoin_engine_free(engine);
  printf("test_arrow: ok (%llu pairs)\n", (unsigned long long)rows);
  return 0;
}
