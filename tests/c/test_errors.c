/* Every error path of the C ABI: NULL pointers, NaN/inf coordinates, eps <= 0 or NaN,
 * zero dimensions, mismatched dimensions and dtypes, unknown enum values, an options struct
 * that was never initialised, wrong result accessors; plus empty input (not an error),
 * out-parameters untouched on failure, _free(NULL), messages and version. */
#include "check.h"

static simjoin_engine *engine;
static simjoin_result *const SENTINEL = (simjoin_result *)16;
static simjoin_engine *const SENTINEL_ENGINE = (simjoin_engine *)32;

/* Runs a self-join that must fail with `want`, leave `out` untouched and leave a message
 * containing `needle`. */
static void expect_self_join_error(const simjoin_matrix *m, const simjoin_options *opts,
                                   simjoin_status want, const char *needle) {
  simjoin_result *out = SENTINEL;
  char msg[512];
  simjoin_status got = simjoin_self_join(engine, m, opts, &out);
  if (got != want) fprintf(stderr, "want status %u, got %u\n", (unsigned)want, (unsigned)got);
  CHECK(got == want);
  CHECK(out == SENTINEL);
  simjoin_last_error_message(msg, sizeof msg);
  if (!strstr(msg, needle)) fprintf(stderr, "message '%s' lacks '%s'\n", msg, needle);
  CHECK(strstr(msg, needle) != NULL);
}

static int never_called(void *user_data, const uint32_t *pairs, size_t count) {
  (void)user_data; (void)pairs; (void)count;
  return 1;
}

int main(void) {
  float points[6] = {0, 0, 1, 1, 2, 2};
  double points64[6] = {0, 0, 1, 1, 2, 2};
  float bad[6] = {0, 0, 1, 1, 2, 2};
  simjoin_matrix m = {points, 3, 2, SIMJOIN_DTYPE_F32}, m64 = {points64, 3, 2, SIMJOIN_DTYPE_F64};
  simjoin_matrix b3 = {points, 2, 3, SIMJOIN_DTYPE_F32}, x;
  simjoin_options opts, o;
  simjoin_result *out = SENTINEL;
  simjoin_engine *e = NULL;
  const uint32_t *pairs;
  const uint64_t *offsets;
  const uint32_t *neighbors;
  size_t count, rows, nnz;
  char msg[512], tiny[4];
  simjoin_report report;

  /* Version and status strings. */
  CHECK(strcmp(simjoin_version(), SIMJOIN_VERSION_STRING) == 0);
  CHECK(strcmp(simjoin_status_str(SIMJOIN_OK), "ok") == 0);
  CHECK(strcmp(simjoin_status_str(SIMJOIN_INVALID_ARGUMENT), "invalid argument") == 0);
  CHECK(strcmp(simjoin_status_str(12345), "unknown status") == 0);

  /* NULL out-parameters and handles. */
  CHECK(simjoin_engine_new(NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK((simjoin_options_init)(NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK_OK(simjoin_engine_new(&engine));
  CHECK_OK(simjoin_options_init(&opts));
  opts.eps = 1.5;
  CHECK(simjoin_self_join(NULL, &m, &opts, &out) == SIMJOIN_INVALID_ARGUMENT && out == SENTINEL);
  simjoin_last_error_message(msg, sizeof msg);
  CHECK(strstr(msg, "'engine' is NULL") != NULL);
  expect_self_join_error(NULL, &opts, SIMJOIN_INVALID_ARGUMENT, "'points' is NULL");
  expect_self_join_error(&m, NULL, SIMJOIN_INVALID_ARGUMENT, "'opts' is NULL");
  CHECK(simjoin_self_join(engine, &m, &opts, NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_join(engine, &m, NULL, &opts, &out) == SIMJOIN_INVALID_ARGUMENT && out == SENTINEL);
  CHECK(simjoin_join(engine, NULL, &m, &opts, &out) == SIMJOIN_INVALID_ARGUMENT && out == SENTINEL);
  CHECK(simjoin_self_join_stream(engine, &m, &opts, NULL, NULL, &out) == SIMJOIN_INVALID_ARGUMENT);
  simjoin_last_error_message(msg, sizeof msg);
  CHECK(strstr(msg, "'callback' is NULL") != NULL);
  CHECK(simjoin_join_stream(engine, &m, NULL, &opts, never_called, NULL, &out) ==
        SIMJOIN_INVALID_ARGUMENT);
  CHECK(out == SENTINEL);
  x = m;
  x.data = NULL;
  expect_self_join_error(&x, &opts, SIMJOIN_INVALID_ARGUMENT, "data is NULL");

  /* A pointer not aligned for the dtype. */
  x = m64;
  x.data = (const char *)points64 + 1;
  x.rows = 1;
  expect_self_join_error(&x, &opts, SIMJOIN_INVALID_ARGUMENT, "not aligned");

  /* NaN and infinite coordinates, in both precisions. */
  bad[3] = NAN;
  x = m;
  x.data = bad;
  expect_self_join_error(&x, &opts, SIMJOIN_INVALID_ARGUMENT, "not finite");
  bad[3] = INFINITY;
  expect_self_join_error(&x, &opts, SIMJOIN_INVALID_ARGUMENT, "not finite");
  points64[4] = -INFINITY;
  expect_self_join_error(&m64, &opts, SIMJOIN_INVALID_ARGUMENT, "not finite");
  points64[4] = 2;

  /* eps <= 0, NaN or infinite. */
  o = opts;
  o.eps = 0.0;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "eps");
  o.eps = -1.0;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "eps");
  o.eps = NAN;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "eps");
  o.eps = INFINITY;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "eps");
  /* eps beyond what the coordinates' precision compares exactly: eps squared infinite or
   * zero in float (f32 points) or double. */
  o.eps = 1e20;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "out of range for f32 coordinates");
  o.eps = 1e-20;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "out of range for f32 coordinates");
  o.eps = 1e200;
  expect_self_join_error(&m64, &o, SIMJOIN_INVALID_ARGUMENT, "out of range for f64 coordinates");
  o.eps = 1e20;
  {
    simjoin_result *r = NULL;
    CHECK_OK(simjoin_self_join(engine, &m64, &o, &r)); /* fine in double */
    CHECK(simjoin_result_count(r) == 3);
    simjoin_result_free(r);
  }

  /* Zero dimensions; unknown dtype and enum values; an options struct never initialised. */
  x = m;
  x.cols = 0;
  expect_self_join_error(&x, &opts, SIMJOIN_INVALID_ARGUMENT, "at least one dimension");
  x = m;
  x.dtype = 7;
  expect_self_join_error(&x, &opts, SIMJOIN_INVALID_ARGUMENT, "unknown dtype value 7");
  o = opts;
  o.metric = 99;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "unknown metric value 99");
  o = opts;
  o.backend = 9;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "unknown backend value 9");
  o = opts;
  o.algorithm = 99;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "unknown algorithm value 99");
  o = opts;
  o.output = 3;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "unknown output value 3");
  memset(&o, 0, sizeof o);
  o.eps = 1.0;
  expect_self_join_error(&m, &o, SIMJOIN_INVALID_ARGUMENT, "simjoin_options_init");

  /* Mismatched dimensions and precisions in A join B. */
  CHECK(simjoin_join(engine, &m, &b3, &opts, &out) == SIMJOIN_INVALID_ARGUMENT && out == SENTINEL);
  simjoin_last_error_message(msg, sizeof msg);
  CHECK(strstr(msg, "dimensions") != NULL);
  CHECK(simjoin_join(engine, &m, &m64, &opts, &out) == SIMJOIN_INVALID_ARGUMENT && out == SENTINEL);
  simjoin_last_error_message(msg, sizeof msg);
  CHECK(strstr(msg, "precision") != NULL);

  /* The message function: snprintf-style truncation, NULL buffer gives the length. */
  CHECK(simjoin_last_error_message(NULL, 0) == strlen(msg));
  CHECK(simjoin_last_error_message(tiny, sizeof tiny) == strlen(msg));
  CHECK(strlen(tiny) == 3 && strncmp(tiny, msg, 3) == 0);

  /* Empty input is not an error: zero pairs. */
  x = m;
  x.rows = 0;
  x.data = NULL;
  CHECK_OK(simjoin_self_join(engine, &x, &opts, &out));
  CHECK(simjoin_result_count(out) == 0);
  CHECK_OK(simjoin_result_pairs(out, &pairs, &count));
  CHECK(count == 0);
  CHECK(simjoin_last_error_message(NULL, 0) == 0); /* success clears the message */
  /* Wrong accessors, NULL result and NULL out-parameters. */
  rows = 77;
  CHECK(simjoin_result_csr(out, &offsets, &rows, &neighbors, &nnz) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(rows == 77);
  CHECK(simjoin_result_pairs(out, NULL, &count) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_result_pairs(out, &pairs, NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_result_pairs(NULL, &pairs, &count) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_result_csr(NULL, &offsets, &rows, &neighbors, &nnz) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_result_report(NULL, &report) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_result_report(out, NULL) == SIMJOIN_INVALID_ARGUMENT);
  CHECK(simjoin_result_count(NULL) == 0);
  CHECK(simjoin_result_output(NULL) == SIMJOIN_OUTPUT_COUNT);
  simjoin_result_free(out);

  /* A GPU device that is not there is a clear error, not a crash; `auto` on that engine
   * runs on the CPU. Engine options are checked at creation. */
  {
    simjoin_engine_options eo;
    simjoin_engine *elsewhere = NULL, *bad = SENTINEL_ENGINE;
    CHECK((simjoin_engine_options_init)(NULL) == SIMJOIN_INVALID_ARGUMENT);
    CHECK_OK(simjoin_engine_options_init(&eo));
    CHECK(eo.size == sizeof eo && eo.device == NULL && eo.threads == 0);
    eo.validation = 99;
    CHECK(simjoin_engine_new_with(&eo, &bad) == SIMJOIN_INVALID_ARGUMENT && bad == SENTINEL_ENGINE);
    eo.validation = SIMJOIN_VALIDATION_DEFAULT;
    eo.size = 0;
    CHECK(simjoin_engine_new_with(&eo, &bad) == SIMJOIN_INVALID_ARGUMENT && bad == SENTINEL_ENGINE);
    CHECK_OK(simjoin_engine_options_init(&eo));
    CHECK(simjoin_engine_new_with(&eo, NULL) == SIMJOIN_INVALID_ARGUMENT);
    eo.device = "no such device";
    CHECK_OK(simjoin_engine_new_with(&eo, &elsewhere));
    o = opts;
    o.backend = SIMJOIN_BACKEND_GPU;
    out = SENTINEL;
    CHECK(simjoin_self_join(elsewhere, &m, &o, &out) == SIMJOIN_NO_DEVICE && out == SENTINEL);
    CHECK(simjoin_last_error_message(NULL, 0) > 0);
    o.backend = SIMJOIN_BACKEND_AUTO;
    CHECK_OK(simjoin_self_join(elsewhere, &m, &o, &out));
    simjoin_result_free(out);
    simjoin_engine_free(elsewhere);
    CHECK(simjoin_abi_version() == SIMJOIN_ABI_VERSION);
  }

  /* Every _free accepts NULL. */
  simjoin_result_free(NULL);
  simjoin_engine_free(NULL);
  simjoin_engine_free(e);
  simjoin_engine_free(engine);
  printf("errors: ok\n");
  return 0;
}
