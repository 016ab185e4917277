/* Stopping and watching calls from C (simjoin_control): a 32-D self-join that finds no
 * pairs, a kNN and a DBSCAN, each cancelled from another thread while it runs, must return
 * SIMJOIN_CANCELLED within 250 ms; a cancelled control stops the next call at once; a
 * progress callback is called and its non-zero answer stops the call; polled progress
 * reaches 1 with every pair counted; the engine joins normally afterwards. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>

#include "check.h"

enum { N = 200000, D = 32 };
static float *points;
static simjoin_engine *engine;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

struct call {
  int kind; /* 0 join, 1 knn, 2 dbscan */
  simjoin_control *control;
  simjoin_status status;
  double ended;
};

static void *run(void *arg) {
  struct call *c = arg;
  simjoin_matrix m = {points, N, D, SIMJOIN_DTYPE_F32};
  if (c->kind == 0) {
    simjoin_options opts;
    simjoin_result *res = NULL;
    CHECK_OK(simjoin_options_init(&opts));
    opts.eps = 0.5; /* no pair within 0.5 among these points, but nothing is pruned */
    opts.backend = SIMJOIN_BACKEND_CPU;
    opts.control = c->control;
    c->status = simjoin_self_join(engine, &m, &opts, &res);
    simjoin_result_free(res);
  } else if (c->kind == 1) {
    simjoin_knn_options opts;
    simjoin_knn_result *res = NULL;
    CHECK_OK(simjoin_knn_options_init(&opts));
    opts.backend = SIMJOIN_BACKEND_CPU;
    opts.algorithm = SIMJOIN_ALGORITHM_BRUTE;
    opts.control = c->control;
    c->status = simjoin_knn(engine, &m, NULL, 10, &opts, &res);
    simjoin_knn_result_free(res);
  } else {
    simjoin_dbscan_options opts;
    simjoin_dbscan_report report;
    int64_t *labels = malloc(sizeof(int64_t) * N);
    CHECK(labels != NULL);
    CHECK_OK(simjoin_dbscan_options_init(&opts));
    opts.backend = SIMJOIN_BACKEND_CPU;
    opts.control = c->control;
    c->status = simjoin_dbscan(engine, &m, 0.5, 5, &opts, labels, NULL, &report);
    free(labels);
  }
  c->ended = now();
  return NULL;
}

static void stopped_within_250_ms(int kind) {
  struct call c = {kind, NULL, SIMJOIN_OK, 0};
  pthread_t t;
  double asked;
  CHECK_OK(simjoin_control_new(&c.control));
  CHECK(pthread_create(&t, NULL, run, &c) == 0);
  sleep_ms(300);
  asked = now();
  simjoin_control_cancel(c.control);
  CHECK(pthread_join(t, NULL) == 0);
  printf("call %d: stopped %.1f ms after the request\n", kind, (c.ended - asked) * 1e3);
  CHECK(c.status == SIMJOIN_CANCELLED);
  CHECK(c.ended - asked < 0.25);
  CHECK(simjoin_control_is_cancelled(c.control));
  /* The control stays cancelled: the next call with it ends at once. */
  asked = now();
  run(&c);
  CHECK(c.status == SIMJOIN_CANCELLED);
  CHECK(c.ended - asked < 0.05);
  simjoin_control_free(c.control);
}

static int calls;
static int stop_after_three(void *user, const simjoin_progress *p) {
  (void)user;
  CHECK(p->fraction >= 0.0 && p->fraction <= 1.0);
  CHECK(p->stage != NULL);
  return ++calls >= 3;
}

int main(void) {
  size_t i;
  points = malloc(sizeof(float) * N * D);
  CHECK(points != NULL);
  for (i = 0; i < (size_t)N * D; i++) points[i] = (float)next_uniform();
  CHECK_OK(simjoin_engine_new(&engine));
  for (i = 0; i < 3; i++) stopped_within_250_ms((int)i);

  /* A callback answering non-zero stops the call. */
  {
    struct call c = {0, NULL, SIMJOIN_OK, 0};
    CHECK_OK(simjoin_control_new_with_progress(stop_after_three, NULL, 20, &c.control));
    run(&c);
    CHECK(c.status == SIMJOIN_CANCELLED);
    CHECK(calls == 3);
    simjoin_control_free(c.control);
    CHECK(simjoin_control_new_with_progress(NULL, NULL, 20, &c.control) ==
          SIMJOIN_INVALID_ARGUMENT);
  }

  /* Polled progress after a join that ran to the end: every pair counted. */
  {
    simjoin_control *control;
    simjoin_options opts;
    simjoin_result *res = NULL;
    simjoin_progress p;
    simjoin_matrix m = {points, N / 4, 2, SIMJOIN_DTYPE_F32};
    size_t count;
    const uint32_t *pairs;
    CHECK_OK(simjoin_control_new(&control));
    CHECK_OK(simjoin_options_init(&opts));
    opts.eps = 0.01;
    opts.backend = SIMJOIN_BACKEND_CPU;
    opts.control = control;
    CHECK_OK(simjoin_self_join(engine, &m, &opts, &res));
    CHECK_OK(simjoin_result_pairs(res, &pairs, &count));
    CHECK(count > 1000);
    CHECK_OK(simjoin_control_progress(control, &p));
    CHECK(strcmp(p.stage, "join") == 0);
    CHECK(p.fraction == 1.0);
    CHECK(p.pairs == count);
    CHECK(p.elapsed > 0.0);
    simjoin_result_free(res);
    simjoin_control_free(control);
    CHECK(simjoin_control_progress(NULL, &p) == SIMJOIN_INVALID_ARGUMENT);
    simjoin_control_cancel(NULL); /* ignored */
    CHECK(simjoin_control_is_cancelled(NULL) == 0);
  }
  simjoin_engine_free(engine);
  free(points);
  printf("ok\n");
  return 0;
}
