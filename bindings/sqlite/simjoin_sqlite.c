/* SQLite loadable extension: the table-valued functions (eponymous virtual tables)
 *   simjoin_self_join(points, eps [, metric [, backend [, threads]]])       -> id_a, id_b, distance
 *   simjoin_join(points_a, points_b, eps [, metric [, backend [, threads]]]) -> id_a, id_b, distance
 * `points` is the SQL text of one read-only statement run on the same connection (a
 * statement that would write is refused): first column an integer id, the others numeric
 * coordinates (one column per dimension). Self-join pairs come once, id_a < id_b.
 * `distance` is recomputed in double (sqrt of the sum of squares, sum of |d|, max |d|).
 * metric: euclidean (default), manhattan, chebyshev, cosine; backend: auto (default), cpu, gpu;
 * threads: CPU worker threads, 0 (default) = all cores.
 *
 * Every simjoin call is in ../common/sj_pipe.c: the join runs on threads of its own and
 * xNext pops chunks of pairs from a bounded queue, so rows stream without the whole result
 * in memory, and no SQLite function runs on a simjoin thread.
 *
 * Stopping: while xNext waits for pairs it steps a small probe statement on the connection
 * every POLL_MS. SQLite checks sqlite3_interrupt's flag when a statement starts and calls
 * the connection's progress handler every N virtual-machine steps, so the probe fails with
 * SQLITE_INTERRUPT after sqlite3_interrupt or when the progress handler asks to stop; the
 * join is then stopped (sj_pipe_close: every thread of it ended) and xNext returns
 * SQLITE_INTERRUPT. A cursor closed early (LIMIT, an error) stops its join the same way. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3ext.h>
SQLITE_EXTENSION_INIT1

#include "sj_pipe.h"

/* Columns: id_a, id_b, distance, then the hidden arguments. */
enum { COL_ID_A, COL_ID_B, COL_DISTANCE, COL_ARG0 };

/* How often (ms) xNext looks for an interrupt while it waits for pairs. */
#define POLL_MS 5

/* The probe: about 3,400 virtual-machine steps (some 20 us), so a progress handler set to
 * be called every N <= 3400 steps is called at each poll (larger N: every N/3400 polls). */
#define PROBE_SQL \
  "WITH RECURSIVE c(x) AS (VALUES(0) UNION ALL SELECT x + 1 FROM c WHERE x < 200) SELECT count(*) FROM c"

typedef struct sj_vtab {
  sqlite3_vtab base;
  sqlite3 *db;
  int self;    /* simjoin_self_join: arguments points, eps, metric, backend, threads */
  int nqueries; /* 1 (self) or 2 */
  int nargs;    /* nqueries + 4 */
} sj_vtab;

typedef struct sj_cursor {
  sqlite3_vtab_cursor base;
  sj_pipe *pipe;
  sqlite3_stmt *probe; /* PROBE_SQL, prepared at the first wait */
  int64_t *ids_a, *ids_b;
  int self;
  const uint32_t *pairs;
  size_t count, pos;
  sqlite3_int64 rowid;
  int eof;
} sj_cursor;

static int sj_connect(sqlite3 *db, void *aux, int argc, const char *const *argv,
                      sqlite3_vtab **out, char **err) {
  int self = aux != NULL;
  sj_vtab *v;
  int rc = sqlite3_declare_vtab(
      db, self ? "CREATE TABLE x(id_a INTEGER, id_b INTEGER, distance REAL, points HIDDEN, eps HIDDEN, "
                 "metric HIDDEN, backend HIDDEN, threads HIDDEN)"
               : "CREATE TABLE x(id_a INTEGER, id_b INTEGER, distance REAL, points_a HIDDEN, points_b HIDDEN, "
                 "eps HIDDEN, metric HIDDEN, backend HIDDEN, threads HIDDEN)");
  (void)argc;
  (void)argv;
  (void)err;
  if (rc != SQLITE_OK) return rc;
  v = sqlite3_malloc(sizeof *v);
  if (!v) return SQLITE_NOMEM;
  memset(v, 0, sizeof *v);
  v->db = db;
  v->self = self;
  v->nqueries = self ? 1 : 2;
  v->nargs = v->nqueries + 4;
  *out = &v->base;
  return SQLITE_OK;
}

static int sj_disconnect(sqlite3_vtab *vt) {
  sqlite3_free(vt);
  return SQLITE_OK;
}

/* idxNum: bit k set when hidden argument k is given (as an equality constraint); the
 * arguments reach xFilter in column order. */
static int sj_best_index(sqlite3_vtab *vt, sqlite3_index_info *info) {
  sj_vtab *v = (sj_vtab *)vt;
  int which[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  int k, n = 0, mask = 0, required = v->nqueries + 1; /* the queries and eps */
  for (k = 0; k < info->nConstraint; k++) {
    const struct sqlite3_index_constraint *c = &info->aConstraint[k];
    int arg = c->iColumn - COL_ARG0;
    if (arg < 0 || arg >= v->nargs) continue;
    if (c->op != SQLITE_INDEX_CONSTRAINT_EQ) continue;
    if (!c->usable) return SQLITE_CONSTRAINT; /* try another join order */
    which[arg] = k;
  }
  for (k = 0; k < v->nargs; k++) {
    if (which[k] < 0) continue;
    mask |= 1 << k;
    info->aConstraintUsage[which[k]].argvIndex = ++n;
    info->aConstraintUsage[which[k]].omit = 1;
  }
  info->idxNum = mask;
  info->estimatedCost = (mask & ((1 << required) - 1)) == (1 << required) - 1 ? 1e6 : 1e300;
  info->estimatedRows = 1000;
  return SQLITE_OK;
}

static int sj_open(sqlite3_vtab *vt, sqlite3_vtab_cursor **out) {
  sj_cursor *c = sqlite3_malloc(sizeof *c);
  (void)vt;
  if (!c) return SQLITE_NOMEM;
  memset(c, 0, sizeof *c);
  c->eof = 1;
  *out = &c->base;
  return SQLITE_OK;
}

static void reset(sj_cursor *c) {
  sj_pipe_close(c->pipe); /* stops the join and waits for every thread of it */
  c->pipe = NULL;
  free(c->ids_a);
  free(c->ids_b);
  c->ids_a = c->ids_b = NULL;
  c->pairs = NULL;
  c->count = c->pos = 0;
  c->eof = 1;
}

static int sj_close(sqlite3_vtab_cursor *cur) {
  reset((sj_cursor *)cur);
  sqlite3_finalize(((sj_cursor *)cur)->probe);
  sqlite3_free(cur);
  return SQLITE_OK;
}

static int fail(sj_cursor *c, const char *fmt, const char *a, const char *b) {
  sqlite3_vtab *vt = c->base.pVtab;
  sqlite3_free(vt->zErrMsg);
  vt->zErrMsg = sqlite3_mprintf(fmt, a, b);
  return SQLITE_ERROR;
}

/* Runs `sql` and reads (id, coordinates...) rows into malloc'd arrays. */
static int read_points(sj_cursor *c, const char *what, const char *sql, int64_t **ids,
                       double **coords, size_t *n, size_t *dim) {
  sqlite3 *db = ((sj_vtab *)c->base.pVtab)->db;
  sqlite3_stmt *st = NULL;
  size_t cap = 0, cols;
  int rc, k;
  char num[64];
  const char *tail = NULL;
  *ids = NULL;
  *coords = NULL;
  *n = 0;
  if (sqlite3_prepare_v2(db, sql, -1, &st, &tail) != SQLITE_OK)
    return fail(c, "simjoin: cannot prepare the %s query: %s", what, sqlite3_errmsg(db));
  if (!st) return fail(c, "simjoin: the %s query is empty%s", what, "");
  if (!sqlite3_stmt_readonly(st)) {
    sqlite3_finalize(st);
    return fail(c, "simjoin: the %s query must be read-only (a SELECT); it would write to the database%s",
                what, "");
  }
  while (tail && *tail && (*tail == ' ' || *tail == '\t' || *tail == '\n' || *tail == '\r' || *tail == ';'))
    tail++;
  if (tail && *tail) {
    sqlite3_finalize(st);
    return fail(c, "simjoin: the %s query must be one statement (text follows it: \"%.40s\")", what, tail);
  }
  cols = (size_t)sqlite3_column_count(st);
  if (cols < 2) {
    sqlite3_finalize(st);
    return fail(c, "simjoin: the %s query must return an integer id and coordinates%s", what, "");
  }
  *dim = cols - 1;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    double *row;
    if (sqlite3_column_type(st, 0) != SQLITE_INTEGER) {
      snprintf(num, sizeof num, "%zu", *n + 1);
      sqlite3_finalize(st);
      return fail(c, "simjoin: the id (first column) in row %s of the %s query is not an integer", num, what);
    }
    if (*n == cap) {
      size_t ncap = cap ? cap * 2 : 1024;
      int64_t *ni = realloc(*ids, ncap * sizeof **ids);
      double *nc = ni ? realloc(*coords, ncap * *dim * sizeof **coords) : NULL;
      if (ni) *ids = ni;
      if (nc) *coords = nc;
      if (!ni || !nc) {
        sqlite3_finalize(st);
        return SQLITE_NOMEM;
      }
      cap = ncap;
    }
    (*ids)[*n] = sqlite3_column_int64(st, 0);
    row = *coords + *n * *dim;
    for (k = 1; k < (int)cols; k++) {
      int t = sqlite3_column_type(st, k);
      if (t != SQLITE_INTEGER && t != SQLITE_FLOAT) {
        snprintf(num, sizeof num, "%d (\"%s\") for id %lld", k + 1, sqlite3_column_name(st, k),
                 (long long)(*ids)[*n]);
        sqlite3_finalize(st);
        return fail(c, "simjoin: coordinate column %s in the %s query is NULL or not a number",
                    num, what);
      }
      row[k - 1] = sqlite3_column_double(st, k);
    }
    (*n)++;
  }
  if (rc != SQLITE_DONE) {
    fail(c, "simjoin: the %s query failed: %s", what, sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return rc == SQLITE_INTERRUPT ? SQLITE_INTERRUPT : SQLITE_ERROR;
  }
  sqlite3_finalize(st);
  return SQLITE_OK;
}

/* SQLITE_INTERRUPT when sqlite3_interrupt was called on the connection or its progress
 * handler asks to stop (see the top of the file); SQLITE_OK otherwise. */
static int interrupted(sj_cursor *c) {
  sqlite3 *db = ((sj_vtab *)c->base.pVtab)->db;
  int rc;
  if (!c->probe && sqlite3_prepare_v2(db, PROBE_SQL, -1, &c->probe, NULL) != SQLITE_OK) {
    c->probe = NULL;
    return SQLITE_OK;
  }
  rc = sqlite3_step(c->probe);
  sqlite3_reset(c->probe);
  return rc == SQLITE_INTERRUPT ? SQLITE_INTERRUPT : SQLITE_OK;
}

static int advance(sj_cursor *c) {
  for (;;) {
    int r;
    if (c->pairs && ++c->pos < c->count) return SQLITE_OK;
    r = sj_pipe_next(c->pipe, &c->pairs, &c->count, POLL_MS);
    c->pos = 0;
    if (r == SJ_CHUNK) {
      c->pos = (size_t)-1; /* ++ above makes it 0 */
      continue;
    }
    c->pairs = NULL;
    if (r == SJ_WAIT) {
      if (interrupted(c) == SQLITE_INTERRUPT) {
        reset(c); /* the join stops; every thread of it has ended when this returns */
        return SQLITE_INTERRUPT;
      }
      continue;
    }
    if (r == SJ_END) {
      c->eof = 1;
      return SQLITE_OK;
    }
    return fail(c, "simjoin: %s%s", sj_pipe_error(c->pipe), "");
  }
}

static int sj_filter(sqlite3_vtab_cursor *cur, int idxNum, const char *idxStr, int argc,
                     sqlite3_value **argv) {
  sj_cursor *c = (sj_cursor *)cur;
  sj_vtab *v = (sj_vtab *)cur->pVtab;
  const char *q[2] = {NULL, NULL};
  double eps = 0.0, *ca = NULL, *cb = NULL;
  size_t na = 0, nb = 0, dima = 0, dimb = 0;
  int metric = 0, backend = 0, k, i = 0, rc;
  uint64_t threads = 0;
  char err[1024];
  (void)idxStr;
  (void)argc;
  reset(c);
  c->self = v->self;
  for (k = 0; k < v->nargs; k++) {
    sqlite3_value *val;
    int t;
    if (!(idxNum & (1 << k))) continue;
    val = argv[i++];
    t = sqlite3_value_type(val);
    if (k < v->nqueries) { /* a query */
      if (t != SQLITE_TEXT)
        return fail(c, "simjoin: the %s argument must be SQL text", k == 0 ? (v->self ? "points" : "points_a") : "points_b", "");
      q[k] = (const char *)sqlite3_value_text(val);
    } else if (k == v->nqueries) {
      if (t != SQLITE_INTEGER && t != SQLITE_FLOAT) return fail(c, "simjoin: eps must be a number%s%s", "", "");
      eps = sqlite3_value_double(val);
    } else if (k == v->nqueries + 1) {
      const char *name = (const char *)sqlite3_value_text(val);
      metric = name ? sj_parse_metric(name) : -1;
      if (metric < 0)
        return fail(c, "simjoin: unknown metric \"%s\" (euclidean, manhattan, chebyshev, cosine or haversine)%s", name ? name : "NULL", "");
    } else if (k == v->nqueries + 2) {
      const char *name = (const char *)sqlite3_value_text(val);
      backend = name ? sj_parse_backend(name) : -1;
      if (backend < 0)
        return fail(c, "simjoin: unknown backend \"%s\" (auto, cpu or gpu)%s", name ? name : "NULL", "");
    } else {
      sqlite3_int64 th = sqlite3_value_int64(val);
      if (t != SQLITE_INTEGER || th < 0 || th > 1024)
        return fail(c, "simjoin: threads must be an integer from 0 (all cores) to 1024%s%s", "", "");
      threads = (uint64_t)th;
    }
  }
  if (!q[0] || (!v->self && !q[1]) || !(idxNum & (1 << v->nqueries)))
    return fail(c, "simjoin: %s%s", v->self ? "usage: simjoin_self_join(points, eps [, metric [, backend [, threads]]])"
                                            : "usage: simjoin_join(points_a, points_b, eps [, metric [, backend [, threads]]])", "");
  rc = read_points(c, v->self ? "points" : "points_a", q[0], &c->ids_a, &ca, &na, &dima);
  if (rc == SQLITE_OK && !v->self)
    rc = read_points(c, "points_b", q[1], &c->ids_b, &cb, &nb, &dimb);
  for (k = 0; k < (v->self ? 1 : 2) && rc == SQLITE_OK; k++) {
    int64_t dup = 0;
    int r = sj_find_duplicate(k ? c->ids_b : c->ids_a, k ? nb : na, &dup);
    if (r < 0) rc = SQLITE_NOMEM;
    if (r > 0) {
      char num[32];
      snprintf(num, sizeof num, "%lld", (long long)dup);
      rc = fail(c, "simjoin: id %s appears more than once in the %s query (each point needs its own id)", num,
                k ? "points_b" : (v->self ? "points" : "points_a"));
    }
  }
  if (rc == SQLITE_OK && !v->self && dima != dimb) {
    char da[32], db[32];
    snprintf(da, sizeof da, "%zu", dima);
    snprintf(db, sizeof db, "%zu", dimb);
    rc = fail(c, "simjoin: points_a has %s dimensions and points_b has %s", da, db);
  }
  if (rc == SQLITE_OK && !v->self && !cb && !(cb = malloc(sizeof *cb))) rc = SQLITE_NOMEM;
  if (rc != SQLITE_OK) {
    free(ca);
    free(cb);
    return rc;
  }
  /* The pipe owns ca and cb from here on. */
  if (sj_pipe_start(&c->pipe, ca, na, cb, nb, dima, eps, metric, backend, threads, err, sizeof err) != 0)
    return fail(c, "simjoin: %s%s", err, "");
  c->eof = 0;
  c->rowid = 0;
  return advance(c);
}

static int sj_next(sqlite3_vtab_cursor *cur) {
  sj_cursor *c = (sj_cursor *)cur;
  c->rowid++;
  return advance(c);
}

static int sj_eof(sqlite3_vtab_cursor *cur) { return ((sj_cursor *)cur)->eof; }

static int sj_column(sqlite3_vtab_cursor *cur, sqlite3_context *ctx, int col) {
  sj_cursor *c = (sj_cursor *)cur;
  uint32_t i = c->pairs[2 * c->pos], j = c->pairs[2 * c->pos + 1];
  int64_t x = c->ids_a[i], y = c->self ? c->ids_a[j] : c->ids_b[j];
  if (c->self && x > y) {
    int64_t t = x;
    x = y;
    y = t;
  }
  switch (col) {
    case COL_ID_A: sqlite3_result_int64(ctx, x); break;
    case COL_ID_B: sqlite3_result_int64(ctx, y); break;
    case COL_DISTANCE:
      sqlite3_result_double(ctx, sj_pipe_distance(c->pipe, i, j));
      break;
    default: sqlite3_result_null(ctx); break; /* hidden arguments */
  }
  return SQLITE_OK;
}

static int sj_rowid(sqlite3_vtab_cursor *cur, sqlite3_int64 *rowid) {
  *rowid = ((sj_cursor *)cur)->rowid;
  return SQLITE_OK;
}

static sqlite3_module sj_module = {
    .iVersion = 0,
    .xCreate = NULL, /* NULL: an eponymous-only virtual table (a table-valued function) */
    .xConnect = sj_connect,
    .xBestIndex = sj_best_index,
    .xDisconnect = sj_disconnect,
    .xOpen = sj_open,
    .xClose = sj_close,
    .xFilter = sj_filter,
    .xNext = sj_next,
    .xEof = sj_eof,
    .xColumn = sj_column,
    .xRowid = sj_rowid,
};

#ifdef _WIN32
__declspec(dllexport)
#else
__attribute__((visibility("default")))
#endif
int sqlite3_simjoin_init(sqlite3 *db, char **err, const sqlite3_api_routines *api) {
  static int self_marker;
  int rc;
  SQLITE_EXTENSION_INIT2(api);
  (void)err;
  rc = sqlite3_create_module(db, "simjoin_self_join", &sj_module, &self_marker);
  if (rc == SQLITE_OK) rc = sqlite3_create_module(db, "simjoin_join", &sj_module, NULL);
  return rc;
}
