/* One engine shared by several threads running joins at once (the header promises this is
 * safe); each thread checks its own result and its own last-error message. Then two
 * engines of their own (one and two CPU threads), each used from its own thread at once. */
#include <pthread.h>

#include "check.h"

enum { THREADS = 4, N = 600 };
static simjoin_engine *engine;
static simjoin_engine *own[2];
static float points[N * 2];
static uint32_t *want;
static size_t want_count;

static void *worker(void *arg) {
  int id = (int)(size_t)arg, round;
  for (round = 0; round < 5; round++) {
    simjoin_options opts;
    simjoin_matrix m = {points, N, 2, SIMJOIN_DTYPE_F32};
    simjoin_result *res = NULL;
    const uint32_t *pairs;
    size_t count;
    char msg[256];
    simjoin_engine *e = id >= THREADS ? own[id - THREADS] : engine;
    CHECK_OK(simjoin_options_init(&opts));
    opts.eps = 0.04;
    CHECK_OK(simjoin_self_join(e, &m, &opts, &res));
    CHECK_OK(simjoin_result_pairs(res, &pairs, &count));
    check_same_pairs(pairs, count, want, want_count);
    simjoin_result_free(res);
    /* A failure in this thread sets this thread's message only. */
    opts.eps = -(double)id - 1.0;
    CHECK(simjoin_self_join(e, &m, &opts, &res) == SIMJOIN_INVALID_ARGUMENT);
    simjoin_last_error_message(msg, sizeof msg);
    CHECK(strstr(msg, "eps") != NULL);
  }
  return NULL;
}

int main(void) {
  pthread_t threads[THREADS];
  size_t i;
  simjoin_matrix m = {points, N, 2, SIMJOIN_DTYPE_F32};
  for (i = 0; i < N * 2; i++) points[i] = (float)next_uniform();
  want = reference_pairs(&m, NULL, 1, SIMJOIN_METRIC_EUCLIDEAN, 0.04, &want_count);
  CHECK(want_count > 100);
  CHECK_OK(simjoin_engine_new(&engine));
  for (i = 0; i < THREADS; i++) CHECK(pthread_create(&threads[i], NULL, worker, (void *)i) == 0);
  for (i = 0; i < THREADS; i++) CHECK(pthread_join(threads[i], NULL) == 0);
  simjoin_engine_free(engine);
  for (i = 0; i < 2; i++) {
    simjoin_engine_options eo;
    CHECK_OK(simjoin_engine_options_init(&eo));
    eo.threads = 1 + i;
    CHECK_OK(simjoin_engine_new_with(&eo, &own[i]));
  }
  for (i = 0; i < 2; i++)
    CHECK(pthread_create(&threads[i], NULL, worker, (void *)(THREADS + i)) == 0);
  for (i = 0; i < 2; i++) CHECK(pthread_join(threads[i], NULL) == 0);
  for (i = 0; i < 2; i++) simjoin_engine_free(own[i]);
  free(want);
  printf("threads: ok\n");
  return 0;
}
