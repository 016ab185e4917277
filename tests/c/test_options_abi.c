/* The options structs as programs compiled against other versions of the header see them.
 * - Older, smaller struct (a field added since): `_init_sized` fills it only as far as it
 *   goes (the bytes after it are untouched) and the library reads the missing fields as
 *   their defaults.
 * - Newer, larger struct (fields this library lacks): its extra bytes are zeroed (their
 *   defaults), accepted while zero, refused (SIMJOIN_UNSUPPORTED) when set.
 * - The `_init` functions themselves (called by programs compiled against 0.2 headers,
 *   which had no macro) write exactly the 0.2 size of their struct, however the struct
 *   grows later.
 * - Compiled against this header, `_init` is the macro passing `sizeof *(opts)`. */
#include "check.h"

#include <stddef.h>

#define PAD(end, align) ((((end) + (align)-1) / (align)) * (align))
/* The structs' sizes in simjoin 0.2 (each ends at the field named here). */
#define OPTIONS_0_2 PAD(offsetof(simjoin_options, distances) + sizeof(uint32_t), sizeof(uint64_t))
#define ENGINE_0_2 PAD(offsetof(simjoin_engine_options, validation) + sizeof(uint32_t), sizeof(uint64_t))
#define KNN_0_2 PAD(offsetof(simjoin_knn_options, lss_lists) + sizeof(uint64_t), sizeof(uint64_t))
#define DBSCAN_0_2 PAD(offsetof(simjoin_dbscan_options, sample_weight) + sizeof(void *), sizeof(void *))
/* The DBSCAN options before `sample_weight` was added. */
#define DBSCAN_OLDER offsetof(simjoin_dbscan_options, sample_weight)

#define BYTES 256
/* Room for any options struct, aligned for any of them, and a canary pattern after it. */
typedef union {
  simjoin_options join;
  simjoin_engine_options engine;
  simjoin_knn_options knn;
  simjoin_dbscan_options dbscan;
  unsigned char b[BYTES];
} buffer;

static void fill(buffer *u) { memset(u->b, 0xA5, BYTES); }

/* Bytes from `from` on are still the canary. */
static int untouched_from(const buffer *u, size_t from) {
  size_t i;
  for (i = from; i < BYTES; i++)
    if (u->b[i] != 0xA5) return 0;
  return 1;
}

static size_t size_field(const buffer *u) {
  size_t s;
  memcpy(&s, u->b, sizeof s);
  return s;
}

int main(void) {
  simjoin_engine *engine;
  buffer u;
  size_t i;
  /* Two clusters of three points, one noise point (2-D). */
  double pts[14] = {0, 0, 0.1, 0, 0, 0.1, 5, 5, 5.1, 5, 5, 5.1, 9, 0};
  simjoin_matrix m = {pts, 7, 2, SIMJOIN_DTYPE_F64};
  int64_t labels[7], want[7];
  double weights[7] = {1, 1, 1, 0, 0, 0, 1};
  simjoin_dbscan_options full;
  simjoin_result *res = NULL;

  CHECK_OK(simjoin_engine_new(&engine));

  /* The macro passes the caller's own size. */
  CHECK_OK(simjoin_dbscan_options_init(&full));
  CHECK(full.size == sizeof full && full.sample_weight == NULL);
  CHECK_OK(simjoin_dbscan(engine, &m, 0.2, 3, &full, want, NULL, NULL));
  CHECK(want[0] == 0 && want[3] == 1 && want[6] == -1);

  /* The 0.2 entry points write exactly the 0.2 sizes (parenthesised: the functions, not
   * the macros). */
  fill(&u);
  CHECK_OK((simjoin_options_init)(&u.join));
  CHECK(size_field(&u) == OPTIONS_0_2 && untouched_from(&u, OPTIONS_0_2));
  fill(&u);
  CHECK_OK((simjoin_engine_options_init)(&u.engine));
  CHECK(size_field(&u) == ENGINE_0_2 && untouched_from(&u, ENGINE_0_2));
  fill(&u);
  CHECK_OK((simjoin_knn_options_init)(&u.knn));
  CHECK(size_field(&u) == KNN_0_2 && untouched_from(&u, KNN_0_2));
  fill(&u);
  CHECK_OK((simjoin_dbscan_options_init)(&u.dbscan));
  CHECK(size_field(&u) == DBSCAN_0_2 && untouched_from(&u, DBSCAN_0_2));
  CHECK((simjoin_options_init)(NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK((simjoin_dbscan_options_init)(NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_dbscan_options_init_sized(NULL, sizeof full) == SIMJOIN_INVALID_ARGUMENT);

  /* An older caller's DBSCAN options (before sample_weight): filled only as far as they
   * go, and read with no weights. */
  fill(&u);
  CHECK_OK(simjoin_dbscan_options_init_sized(&u.dbscan, DBSCAN_OLDER));
  CHECK(size_field(&u) == DBSCAN_OLDER && untouched_from(&u, DBSCAN_OLDER));
  CHECK_OK(simjoin_dbscan(engine, &m, 0.2, 3, &u.dbscan, labels, NULL, NULL));
  for (i = 0; i < 7; i++) CHECK(labels[i] == want[i]);
  /* The same struct at full size does read the weights (the second cluster has weight 0:
   * noise). */
  CHECK_OK(simjoin_dbscan_options_init_sized(&u.dbscan, sizeof full));
  u.dbscan.sample_weight = weights;
  CHECK_OK(simjoin_dbscan(engine, &m, 0.2, 3, &u.dbscan, labels, NULL, NULL));
  CHECK(labels[0] == 0 && labels[3] == -1 && labels[4] == -1 && labels[6] == -1);

  /* A newer caller's struct, 16 bytes longer: the extra bytes are zeroed and accepted;
   * set, they are refused. */
  fill(&u);
  CHECK_OK(simjoin_dbscan_options_init_sized(&u.dbscan, sizeof full + 16));
  CHECK(size_field(&u) == sizeof full + 16 && untouched_from(&u, sizeof full + 16));
  for (i = sizeof full; i < sizeof full + 16; i++) CHECK(u.b[i] == 0);
  CHECK_OK(simjoin_dbscan(engine, &m, 0.2, 3, &u.dbscan, labels, NULL, NULL));
  for (i = 0; i < 7; i++) CHECK(labels[i] == want[i]);
  u.b[sizeof full + 3] = 1;
  CHECK(simjoin_dbscan(engine, &m, 0.2, 3, &u.dbscan, labels, NULL, NULL) == SIMJOIN_UNSUPPORTED);

  /* The same for the join options: an older, smaller struct (up to result_buffer_pairs)
   * runs a join with the later fields' defaults. */
  fill(&u);
  CHECK_OK(simjoin_options_init_sized(&u.join, offsetof(simjoin_options, lss_lists)));
  CHECK(untouched_from(&u, offsetof(simjoin_options, lss_lists)));
  u.join.eps = 0.2;
  CHECK_OK(simjoin_self_join(engine, &m, &u.join, &res));
  CHECK(simjoin_result_count(res) == 6);
  simjoin_result_free(res);

  /* Too small to hold its size, or (join options) its eps: refused, nothing written. */
  fill(&u);
  CHECK(simjoin_dbscan_options_init_sized(&u.dbscan, 4) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_options_init_sized(&u.join, offsetof(simjoin_options, eps)) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(untouched_from(&u, 0));

  simjoin_engine_free(engine);
  printf("options abi: ok\n");
  return 0;
}
