/* sj_pipe: see sj_pipe.h. Every call into simjoin of the database extensions is here. */
#include "sj_pipe.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "simjoin.h"

/* Chunks the queue holds before the join waits for the consumer. simjoin's CPU backend
 * hands over up to 65536 pairs per chunk, so this is at most a few MiB. */
#define SJ_PIPE_MAX_CHUNKS 8

typedef struct sj_chunk {
  struct sj_chunk *next;
  size_t count;
  uint32_t pairs[]; /* 2 * count */
} sj_chunk;

struct sj_pipe {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on every change of the fields below */
  int stop;          /* the consumer wants no more pairs */
  int done;          /* the join call returned */
  int oom;           /* the callback could not allocate a chunk */
  simjoin_status status;
  char message[1024];
  sj_chunk *head, *tail;
  size_t queued;
  sj_chunk *current; /* handed to the consumer; freed at its next call */

  double *a, *b;
  size_t na, nb, dim;
  /* Haversine: the points' unit vectors (3 doubles a row; ub NULL for a self-join), made
   * once so that a pair's distance is a chord and an asin rather than six sines and
   * cosines; NULL when not haversine or out of memory (sj_distance then). */
  double *ua, *ub;
  simjoin_options opts;
  simjoin_control *control; /* this join's stop flag and progress */
  int engine;               /* index into `engines`; its `users` counts this join */
  pthread_t thread;
  uint64_t callbacks; /* calls of on_pairs */
  struct timespec started;
};

static double seconds_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static pthread_mutex_t engine_mu = PTHREAD_MUTEX_INITIALIZER;
/* One engine per CPU thread count asked for (0 = all cores): created on first use in each
 * process (never in a postmaster before fork). A simjoin engine owns its thread pool, so the
 * thread count is an engine option (C ABI 2). `users` counts the joins running on it; when
 * all slots are taken, an idle engine is freed for a new thread count. */
enum { SJ_MAX_ENGINES = 8 };
static struct {
  uint64_t threads;
  simjoin_engine *engine;
  int users;
} engines[SJ_MAX_ENGINES];
static int n_engines;

/* The slot of the engine for `threads` with its user count raised, or -1 with `err` set.
 * Call with engine_mu held. */
static int engine_for(uint64_t threads, char *err, size_t errlen) {
  simjoin_engine_options eo;
  simjoin_engine *e = NULL;
  int i, slot = -1;
  for (i = 0; i < n_engines; i++)
    if (engines[i].threads == threads) {
      engines[i].users++;
      return i;
    }
  if (n_engines < SJ_MAX_ENGINES) {
    slot = n_engines;
  } else {
    for (i = 0; i < n_engines; i++)
      if (engines[i].users == 0) {
        slot = i;
        break;
      }
    if (slot < 0) {
      snprintf(err, errlen, "simjoin: %d joins with different thread counts already run in this process",
               SJ_MAX_ENGINES);
      return -1;
    }
  }
  if (simjoin_engine_options_init(&eo) != SIMJOIN_OK) {
    simjoin_last_error_message(err, errlen);
    return -1;
  }
  eo.threads = threads;
  if (simjoin_engine_new_with(&eo, &e) != SIMJOIN_OK) {
    simjoin_last_error_message(err, errlen);
    return -1;
  }
  if (slot < n_engines) simjoin_engine_free(engines[slot].engine); /* idle: no join uses it */
  else n_engines++;
  engines[slot].threads = threads;
  engines[slot].engine = e;
  engines[slot].users = 1;
  return slot;
}

static void engine_done(int slot) {
  pthread_mutex_lock(&engine_mu);
  engines[slot].users--;
  pthread_mutex_unlock(&engine_mu);
}

int sj_parse_metric(const char *name) {
  if (!strcasecmp(name, "euclidean")) return SIMJOIN_METRIC_EUCLIDEAN;
  if (!strcasecmp(name, "manhattan")) return SIMJOIN_METRIC_MANHATTAN;
  if (!strcasecmp(name, "chebyshev")) return SIMJOIN_METRIC_CHEBYSHEV;
  if (!strcasecmp(name, "cosine")) return SIMJOIN_METRIC_COSINE;
  if (!strcasecmp(name, "haversine")) return SIMJOIN_METRIC_HAVERSINE;
  return -1;
}

int sj_parse_backend(const char *name) {
  if (!strcasecmp(name, "auto")) return SIMJOIN_BACKEND_AUTO;
  if (!strcasecmp(name, "cpu")) return SIMJOIN_BACKEND_CPU;
  if (!strcasecmp(name, "gpu")) return SIMJOIN_BACKEND_GPU;
  return -1;
}

/* src/metric.rs's geo_unit_vector: (latitude, longitude) in degrees on the unit sphere. */
static void geo_unit_vector(double lat, double lon, double v[3]) {
  double l = fmod(lon, 360.0), p, q;
  if (l > 180.0) l -= 360.0;
  else if (l < -180.0) l += 360.0;
  if (l == 180.0) l = -180.0;
  if (lat == 90.0 || lat == -90.0) l = 0.0;
  p = lat * (M_PI / 180.0);
  q = l * (M_PI / 180.0);
  v[0] = cos(p) * cos(q);
  v[1] = cos(p) * sin(q);
  v[2] = sin(p);
}

/* src/metric.rs's geo_chord2 and geo_distance_m on the Earth: 2 R asin(min(chord / 2, 1)),
 * R = 6,371,008.8 m, the chord squared summed in order. */
static double geo_metres(const double u[3], const double v[3]) {
  double c = 0.0, h;
  size_t k;
  for (k = 0; k < 3; k++) c += (u[k] - v[k]) * (u[k] - v[k]);
  h = sqrt(c) / 2.0;
  return 2.0 * 6371008.8 * asin(h < 1.0 ? h : 1.0);
}

/* The unit vectors of `n` (latitude, longitude) rows, or NULL out of memory. */
static double *geo_vectors(const double *x, size_t n) {
  double *u = malloc((n ? n : 1) * 3 * sizeof *u);
  size_t i;
  if (u)
    for (i = 0; i < n; i++) geo_unit_vector(x[2 * i], x[2 * i + 1], u + 3 * i);
  return u;
}

double sj_distance(int metric, const double *x, const double *y, size_t dim) {
  double acc = 0.0;
  size_t k;
  if (metric == SIMJOIN_METRIC_HAVERSINE && dim == 2) {
    /* The rule's metres: 2 R asin(min(chord / 2, 1)), R = 6,371,008.8 m. */
    double u[3], v[3];
    geo_unit_vector(x[0], x[1], u);
    geo_unit_vector(y[0], y[1], v);
    return geo_metres(u, v);
  }
  if (metric == SIMJOIN_METRIC_COSINE) {
    /* src/metric.rs's rule: f64 sums in dimension order, 1 - dot / (|x| |y|). */
    double nx = 0.0, ny = 0.0, dot = 0.0;
    for (k = 0; k < dim; k++) {
      nx += x[k] * x[k];
      ny += y[k] * y[k];
      dot += x[k] * y[k];
    }
    return 1.0 - dot / (sqrt(nx) * sqrt(ny));
  }
  for (k = 0; k < dim; k++) {
    double d = x[k] - y[k];
    switch (metric) {
      case SIMJOIN_METRIC_MANHATTAN: acc += fabs(d); break;
      case SIMJOIN_METRIC_CHEBYSHEV: if (fabs(d) > acc) acc = fabs(d); break;
      default: acc += d * d; break;
    }
  }
  return metric == SIMJOIN_METRIC_EUCLIDEAN ? sqrt(acc) : acc;
}

static int cmp_i64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return a < b ? -1 : a > b;
}

int sj_find_duplicate(const int64_t *ids, size_t n, int64_t *dup) {
  int64_t *s;
  size_t i;
  for (i = 1; i < n; i++)
    if (ids[i - 1] >= ids[i]) break;
  if (i >= n) return 0;
  s = malloc(n * sizeof *s);
  if (!s) return -1;
  memcpy(s, ids, n * sizeof *s);
  qsort(s, n, sizeof *s, cmp_i64);
  for (i = 1; i < n; i++)
    if (s[i - 1] == s[i]) {
      *dup = s[i];
      free(s);
      return 1;
    }
  free(s);
  return 0;
}

static void destroy(sj_pipe *p) {
  sj_chunk *c = p->head;
  while (c) {
    sj_chunk *next = c->next;
    free(c);
    c = next;
  }
  free(p->current);
  free(p->a);
  free(p->b);
  free(p->ua);
  free(p->ub);
  simjoin_control_free(p->control);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

/* simjoin's callback, on one of its worker threads: queue a copy, never touch the database. */
static int on_pairs(void *user_data, const uint32_t *pairs, size_t count) {
  sj_pipe *p = user_data;
  sj_chunk *c;
  pthread_mutex_lock(&p->mu);
  p->callbacks++;
  while (!p->stop && p->queued >= SJ_PIPE_MAX_CHUNKS) pthread_cond_wait(&p->cv, &p->mu);
  if (p->stop) {
    pthread_mutex_unlock(&p->mu);
    return 1;
  }
  pthread_mutex_unlock(&p->mu);
  if (count == 0) return 0;
  c = malloc(sizeof *c + count * 2 * sizeof(uint32_t));
  pthread_mutex_lock(&p->mu);
  if (!c) {
    p->oom = 1;
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 1;
  }
  memcpy(c->pairs, pairs, count * 2 * sizeof(uint32_t));
  c->count = count;
  c->next = NULL;
  if (p->tail) p->tail->next = c; else p->head = c;
  p->tail = c;
  p->queued++;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return 0;
}

static void *join_thread(void *arg) {
  sj_pipe *p = arg;
  simjoin_matrix a = {p->a, p->na, p->dim, SIMJOIN_DTYPE_F64};
  simjoin_matrix b = {p->b, p->nb, p->dim, SIMJOIN_DTYPE_F64};
  simjoin_engine *engine = engines[p->engine].engine; /* kept while users > 0 */
  simjoin_status st;
  char message[sizeof p->message];
  message[0] = '\0';
  if (p->b)
    st = simjoin_join_stream(engine, &a, &b, &p->opts, on_pairs, p, NULL);
  else
    st = simjoin_self_join_stream(engine, &a, &p->opts, on_pairs, p, NULL);
  if (st != SIMJOIN_OK) simjoin_last_error_message(message, sizeof message);
  pthread_mutex_lock(&p->mu);
  p->status = st;
  if (p->oom)
    snprintf(p->message, sizeof p->message, "out of memory while queueing result pairs");
  else
    snprintf(p->message, sizeof p->message, "%s (%s)", message[0] ? message : "join failed",
             simjoin_status_str(st));
  p->done = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int sj_pipe_start(sj_pipe **out, double *a, size_t na, double *b, size_t nb, size_t dim,
                  double eps, int metric, int backend, uint64_t threads, char *err,
                  size_t errlen) {
  sj_pipe *p;
  simjoin_control *control = NULL;
  sigset_t all, old;
  int rc;

  int engine;

  pthread_mutex_lock(&engine_mu);
  engine = engine_for(threads, err, errlen);
  pthread_mutex_unlock(&engine_mu);
  if (engine < 0) {
    free(a);
    free(b);
    return -1;
  }

  p = calloc(1, sizeof *p);
  if (!p || simjoin_control_new(&control) != SIMJOIN_OK) {
    snprintf(err, errlen, "out of memory");
    free(p);
    free(a);
    free(b);
    engine_done(engine);
    return -1;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->a = a;
  p->b = b;
  p->na = na;
  p->nb = nb;
  p->dim = dim;
  p->control = control;
  simjoin_options_init(&p->opts);
  p->opts.eps = eps;
  p->opts.metric = (simjoin_metric)metric;
  p->opts.backend = (simjoin_backend)backend;
  p->opts.control = control;
  p->engine = engine;
  clock_gettime(CLOCK_MONOTONIC, &p->started);

  /* The join's threads (and simjoin's workers, which inherit the mask) take no signals. */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = pthread_create(&p->thread, NULL, join_thread, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    snprintf(err, errlen, "cannot start the join thread: %s", strerror(rc));
    destroy(p);
    engine_done(engine);
    return -1;
  }
  /* While the join runs (its thread reads only a and b): the unit vectors, on this thread,
   * the only one that reads them. */
  if (metric == SIMJOIN_METRIC_HAVERSINE && dim == 2) {
    p->ua = geo_vectors(a, na);
    p->ub = b && p->ua ? geo_vectors(b, nb) : NULL;
    if (b && !p->ub) {
      free(p->ua);
      p->ua = NULL;
    }
  }
  *out = p;
  return 0;
}

double sj_pipe_distance(const sj_pipe *p, size_t i, size_t j) {
  if (p->ua) return geo_metres(p->ua + 3 * i, (p->ub ? p->ub : p->ua) + 3 * j);
  return sj_distance((int)p->opts.metric, p->a + i * p->dim, sj_pipe_b(p) + j * p->dim, p->dim);
}

const double *sj_pipe_a(const sj_pipe *p) { return p->a; }
const double *sj_pipe_b(const sj_pipe *p) { return p->b ? p->b : p->a; }

static void deadline_in(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

int sj_pipe_next(sj_pipe *p, const uint32_t **pairs, size_t *count, int timeout_ms) {
  struct timespec deadline;
  sj_chunk *c;
  free(p->current);
  p->current = NULL;
  deadline_in(&deadline, timeout_ms);
  pthread_mutex_lock(&p->mu);
  while (!p->head && !p->done) {
    if (pthread_cond_timedwait(&p->cv, &p->mu, &deadline) == ETIMEDOUT && !p->head && !p->done) {
      pthread_mutex_unlock(&p->mu);
      return SJ_WAIT;
    }
  }
  if ((c = p->head) != NULL) {
    p->head = c->next;
    if (!p->head) p->tail = NULL;
    p->queued--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    p->current = c;
    *pairs = c->pairs;
    *count = c->count;
    return SJ_CHUNK;
  }
  pthread_mutex_unlock(&p->mu);
  return p->status == SIMJOIN_OK ? SJ_END : SJ_ERROR;
}

const char *sj_pipe_error(const sj_pipe *p) { return p->message; }

void sj_pipe_cancel(sj_pipe *p) {
  if (p) simjoin_control_cancel(p->control);
}

int sj_pipe_close(sj_pipe *p) {
  struct timespec asked;
  simjoin_progress pr;
  int was_done;
  if (!p) return 1;
  clock_gettime(CLOCK_MONOTONIC, &asked);
  simjoin_control_cancel(p->control);
  pthread_mutex_lock(&p->mu);
  was_done = p->done;
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  memset(&pr, 0, sizeof pr);
  if (!was_done && getenv("SIMJOIN_PIPE_DEBUG") &&
      simjoin_control_progress(p->control, &pr) != SIMJOIN_OK)
    memset(&pr, 0, sizeof pr);
  /* No timeout: the engine stops a cancelled join within milliseconds on the CPU (one
   * batch on a GPU), and a join left running would hold cores, memory and the engine. */
  pthread_join(p->thread, NULL);
  /* With SIMJOIN_PIPE_DEBUG=1, one line per stopped join on stderr (the server log). */
  if (!was_done && getenv("SIMJOIN_PIPE_DEBUG"))
    fprintf(stderr,
            "sj_pipe: stop asked %.3f s into the join (stage %s, %.0f%%), join ended %.3f s later, "
            "%llu callbacks, %s\n",
            seconds_since(&p->started) - seconds_since(&asked), pr.stage ? pr.stage : "?",
            pr.fraction * 100.0, seconds_since(&asked), (unsigned long long)p->callbacks,
            p->status == SIMJOIN_CANCELLED ? "cancelled" : simjoin_status_str(p->status));
  engine_done(p->engine);
  destroy(p);
  return was_done;
}
