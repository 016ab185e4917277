/* PostgreSQL extension: the C functions behind simjoin_self_join(points, eps, metric,
 * backend) and simjoin_join(points_a, points_b, eps, metric, backend) (see
 * simjoin--0.2.0.sql). They are set-returning functions in value-per-call mode: each call
 * hands the executor one pair as the join produces it, so rows stream in bounded memory and
 * LIMIT, EXISTS or a cancel stop the join early. (The SQL functions users call are
 * inlinable SQL wrappers that call these in a target list, where PostgreSQL runs
 * value-per-call functions row by row; in FROM it would store the whole result first.)
 *
 * Every simjoin call is in ../common/sj_pipe.c: the join runs on threads of its own and
 * this file, on the backend's thread, only pops chunks of pairs from a bounded queue. So
 * no PostgreSQL function runs on a simjoin thread, and an ereport/longjmp (an error, a
 * cancel, statement_timeout) never crosses simjoin's frames.
 *
 * Stopping: while it waits for pairs the backend looks for interrupts every POLL_MS; a
 * cancel or statement_timeout there stops the join (sj_pipe_close: cancel, then wait until
 * every thread of the join has stopped) before the error goes on. Wherever else the
 * statement ends (LIMIT satisfied, an error or cancel elsewhere in the plan, the end of the
 * transaction), the join is closed the same way by a reset callback on the function's
 * multi-call memory context, which PostgreSQL deletes at executor shutdown and at abort,
 * before the backend reports it is ready for the next query. */
#include "postgres.h"

#include <limits.h>
#include <math.h>
#include <unistd.h>

#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "lib/stringinfo.h"
#include "nodes/supportnodes.h"
#include "utils/syscache.h"
#include "utils/lsyscache.h"
#include "utils/ruleutils.h"
#include "utils/memutils.h"

#include "sj_pipe.h"

/* Ends the points query of a geography column: only metric 'haversine' may join it. */
#define SJ_GEOGRAPHY_MARK "/* simjoin: geography (latitude, longitude) */"
/* Ends the points query of a single geometry column, (x, y): metric 'haversine' takes it as
 * (longitude, latitude) in degrees, as ST_DistanceSphere does, and swaps it. */
#define SJ_GEOMETRY_MARK "/* simjoin: geometry (x, y) */"

PG_MODULE_MAGIC;

/* simjoin.max_threads (superuser): CPU worker threads a join of one backend may use.
 * simjoin.threads (any user): threads asked for, 0 = simjoin.max_threads; capped by it.
 * simjoin.max_memory (superuser, kB): the most memory the input points of one call may
 * take (their coordinates and ids, and the engine's copy of the coordinates). */
static int sj_max_threads = 4;
static int sj_threads = 0;
static int sj_max_memory_kb = 1024 * 1024;

void _PG_init(void);
void _PG_init(void) {
  DefineCustomIntVariable("simjoin.max_threads",
                          "The most CPU worker threads a simjoin join of one backend may use.",
                          "simjoin.threads is capped by it. Only superusers can change it.",
                          &sj_max_threads, 4, 1, 1024, PGC_SUSET, 0, NULL, NULL, NULL);
  DefineCustomIntVariable("simjoin.threads",
                          "CPU worker threads of a simjoin join (0 = the cores, up to simjoin.max_threads).",
                          "At most simjoin.max_threads are used.", &sj_threads, 0, 0, 1024,
                          PGC_USERSET, 0, NULL, NULL, NULL);
  DefineCustomIntVariable("simjoin.max_memory",
                          "The most memory the input points of one simjoin call may take.",
                          "Counts the coordinates (8 bytes each, twice: the call's copy and the "
                          "engine's) and the ids. Only superusers can change it.",
                          &sj_max_memory_kb, 1024 * 1024, 64, INT_MAX, PGC_SUSET, GUC_UNIT_KB,
                          NULL, NULL, NULL);
#if PG_VERSION_NUM >= 150000
  MarkGUCPrefixReserved("simjoin");
#endif
}

/* How often the backend looks for interrupts while it waits for pairs. */
#define POLL_MS 5

/* One input point set, read from the user's query. `coords` is malloc'd (the join thread
 * owns it once the join starts); a memory context callback frees it if an error comes first. */
typedef struct points {
  const char *what; /* "points", "points_a", "points_b" */
  int64 *ids;       /* palloc'd in the caller's context */
  double *coords;
  size_t n, cap, dim;
  size_t max_rows;  /* simjoin.max_memory's bound, once dim is known */
  size_t *charged;  /* bytes counted against simjoin.max_memory by the inputs read before */
  MemoryContextCallback free_cb;
} points;

/* Bytes one point of `dim` coordinates is counted for. */
static size_t point_bytes(size_t dim) { return 2 * dim * sizeof(double) + sizeof(int64); }

static void set_max_rows(points *p) {
  size_t limit = (size_t)sj_max_memory_kb * 1024;
  size_t left = limit > *p->charged ? limit - *p->charged : 0;
  p->max_rows = left / point_bytes(p->dim);
}

static void over_memory(points *p) {
  ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                  errmsg("simjoin: the %s query returns more points than simjoin.max_memory allows", p->what),
                  errdetail("%zu points of %zu dimensions would take more than %zu kB (%zu kB taken by the inputs before), "
                            "and simjoin.max_memory is %d kB.",
                            p->n + 1, p->dim, (size_t)((p->n + 1) * point_bytes(p->dim) / 1024),
                            *p->charged / 1024, sj_max_memory_kb),
                  errhint("A superuser can raise simjoin.max_memory.")));
}

static void free_coords(void *arg) {
  points *p = arg;
  free(p->coords);
  p->coords = NULL;
}

static double datum_to_double(Datum d, Oid type) {
  switch (type) {
    case INT2OID: return (double)DatumGetInt16(d);
    case INT4OID: return (double)DatumGetInt32(d);
    case INT8OID: return (double)DatumGetInt64(d);
    case FLOAT4OID: return (double)DatumGetFloat4(d);
    case FLOAT8OID: return DatumGetFloat8(d);
    case NUMERICOID: return DatumGetFloat8(DirectFunctionCall1(numeric_float8, d));
    default: elog(ERROR, "unexpected type %u", type);
  }
  return 0.0;
}

static bool is_numeric_type(Oid t) {
  return t == INT2OID || t == INT4OID || t == INT8OID || t == FLOAT4OID || t == FLOAT8OID ||
         t == NUMERICOID;
}

static void grow(points *p, size_t rows_needed, MemoryContext mcxt) {
  size_t cap = p->cap ? p->cap : 1024;
  double *c;
  if (rows_needed <= p->cap) return;
  if (rows_needed > p->max_rows) over_memory(p);
  while (cap < rows_needed) cap *= 2;
  if (cap > p->max_rows) cap = p->max_rows;
  c = realloc(p->coords, cap * p->dim * sizeof(double));
  if (!c) ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("simjoin: out of memory for %zu points", cap)));
  p->coords = c;
  p->ids = p->ids ? repalloc_huge(p->ids, cap * sizeof(int64))
                  : MemoryContextAllocHuge(mcxt, cap * sizeof(int64));
  p->cap = cap;
}

/* Runs `query` (inside SPI) through a cursor and appends its rows to *p. The first column
 * is an integer id; the others are one numeric column per dimension (smallint, integer,
 * bigint, real, double precision, numeric), or one array of such numbers (float8[], ...). */
static void read_points(const char *query, points *p, MemoryContext mcxt) {
  SPIPlanPtr plan;
  Portal portal;
  bool array_mode = false;
  Oid *types = NULL;
  Oid elem_type = InvalidOid;
  int16 elem_len = 0;
  bool elem_byval = false;
  char elem_align = 'd';
  int natts = 0;

  p->free_cb.func = free_coords;
  p->free_cb.arg = p;
  MemoryContextRegisterResetCallback(mcxt, &p->free_cb);

  plan = SPI_prepare(query, 0, NULL);
  if (!plan)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: cannot prepare the %s query: %s", p->what,
                           SPI_result_code_string(SPI_result))));
  if (!SPI_is_cursor_plan(plan))
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: the %s query must be a query that returns rows", p->what)));
  portal = SPI_cursor_open(NULL, plan, NULL, NULL, true);
  for (;;) {
    uint64 r;
    TupleDesc td;
    CHECK_FOR_INTERRUPTS();
    SPI_cursor_fetch(portal, true, 1000);
    if (SPI_processed == 0) break;
    td = SPI_tuptable->tupdesc;
    if (!types) {
      int k;
      natts = td->natts;
      types = palloc(sizeof(Oid) * natts);
      for (k = 0; k < natts; k++) types[k] = getBaseType(TupleDescAttr(td, k)->atttypid);
      if (natts < 2)
        ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                        errmsg("simjoin: the %s query must return an integer id and coordinates (it returns %d column)",
                               p->what, natts)));
      if (types[0] != INT2OID && types[0] != INT4OID && types[0] != INT8OID)
        ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                        errmsg("simjoin: the first column of the %s query must be an integer id, not %s",
                               p->what, format_type_be(types[0]))));
      elem_type = natts == 2 ? get_element_type(types[1]) : InvalidOid;
      if (OidIsValid(elem_type) && is_numeric_type(getBaseType(elem_type))) {
        array_mode = true;
        get_typlenbyvalalign(elem_type, &elem_len, &elem_byval, &elem_align);
        elem_type = getBaseType(elem_type);
      } else {
        for (k = 1; k < natts; k++)
          if (!is_numeric_type(types[k]))
            ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                            errmsg("simjoin: column %d (\"%s\") of the %s query is %s, not a number "
                                   "(give one numeric column per dimension or one array column such as float8[])",
                                   k + 1, NameStr(TupleDescAttr(td, k)->attname), p->what,
                                   format_type_be(types[k]))));
        p->dim = natts - 1;
        set_max_rows(p);
      }
    }
    for (r = 0; r < SPI_processed; r++) {
      HeapTuple t = SPI_tuptable->vals[r];
      bool isnull;
      Datum d = SPI_getbinval(t, td, 1, &isnull);
      int64 id;
      double *row;
      int k;
      if (isnull)
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                        errmsg("simjoin: NULL id in row %zu of the %s query", p->n + 1, p->what)));
      id = types[0] == INT8OID ? DatumGetInt64(d)
           : types[0] == INT4OID ? DatumGetInt32(d) : DatumGetInt16(d);
      if (array_mode) {
        ArrayType *arr;
        Datum *elems;
        bool *nulls;
        int nelems;
        d = SPI_getbinval(t, td, 2, &isnull);
        if (isnull)
          ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                          errmsg("simjoin: NULL coordinates for id " INT64_FORMAT " in the %s query", id, p->what)));
        arr = DatumGetArrayTypeP(d);
        if (ARR_NDIM(arr) > 1)
          ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                          errmsg("simjoin: the coordinates of id " INT64_FORMAT " in the %s query are a %d-dimensional array, not a vector",
                                 id, p->what, ARR_NDIM(arr))));
        deconstruct_array(arr, elem_type, elem_len, elem_byval, elem_align, &elems, &nulls, &nelems);
        if (p->n == 0 && p->dim == 0) {
          if (nelems == 0)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("simjoin: empty coordinate array for id " INT64_FORMAT " in the %s query", id, p->what)));
          p->dim = nelems;
          set_max_rows(p);
        }
        if ((size_t)nelems != p->dim)
          ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                          errmsg("simjoin: id " INT64_FORMAT " has %d coordinates in the %s query, the first row has %zu",
                                 id, nelems, p->what, p->dim)));
        grow(p, p->n + 1, mcxt);
        row = p->coords + p->n * p->dim;
        for (k = 0; k < nelems; k++) {
          if (nulls[k])
            ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                            errmsg("simjoin: NULL coordinate %d for id " INT64_FORMAT " in the %s query", k + 1, id, p->what)));
          row[k] = datum_to_double(elems[k], elem_type);
        }
        pfree(elems);
        pfree(nulls);
        if ((Pointer)arr != DatumGetPointer(d)) pfree(arr);
      } else {
        grow(p, p->n + 1, mcxt);
        row = p->coords + p->n * p->dim;
        for (k = 1; k < natts; k++) {
          d = SPI_getbinval(t, td, k + 1, &isnull);
          if (isnull)
            ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                            errmsg("simjoin: NULL coordinate in column %d (\"%s\") for id " INT64_FORMAT " in the %s query",
                                   k + 1, NameStr(TupleDescAttr(td, k)->attname), id, p->what)));
          row[k - 1] = datum_to_double(d, types[k]);
        }
      }
      p->ids[p->n++] = id;
    }
    SPI_freetuptable(SPI_tuptable);
  }
  SPI_cursor_close(portal);
  if (p->n > UINT32_MAX)
    ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                    errmsg("simjoin: the %s query returned more than 2^32 rows", p->what)));
  *p->charged += p->n * point_bytes(p->dim);
}

/* Ids must be unique within an input: a pair names its points by id. */
static void check_unique(const points *p) {
  int64_t dup = 0;
  int r = sj_find_duplicate((const int64_t *)p->ids, p->n, &dup);
  if (r < 0) ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("simjoin: out of memory")));
  if (r > 0)
    ereport(ERROR, (errcode(ERRCODE_UNIQUE_VIOLATION),
                    errmsg("simjoin: id " INT64_FORMAT " appears more than once in the %s query", (int64)dup, p->what),
                    errhint("Each point needs its own id.")));
}

/* Swaps each 2-column row's coordinates when `swap`. */
static void swap_columns(points *p, bool swap) {
  size_t i;
  if (!swap || p->dim != 2 || !p->coords) return;
  for (i = 0; i < p->n; i++) {
    double t = p->coords[2 * i];
    p->coords[2 * i] = p->coords[2 * i + 1];
    p->coords[2 * i + 1] = t;
  }
}

/* One call's state, in the multi-call memory context. */
typedef struct join_state {
  sj_pipe *pipe; /* NULL once closed */
  points *pa, *pb;
  bool self;
  size_t dim;
  const uint32_t *pairs; /* the current chunk */
  size_t count, pos;
  TupleDesc tupdesc;
  MemoryContextCallback close_cb;
} join_state;

/* Stops the join (if it still runs) and waits until every thread of it has stopped. Runs on
 * the end of the rows, on an error while waiting, and as the multi-call context's reset
 * callback (executor shutdown after LIMIT, errors elsewhere, transaction abort). Never
 * throws. */
static void close_join(void *arg) {
  join_state *st = arg;
  sj_pipe *p = st->pipe;
  st->pipe = NULL;
  st->pairs = NULL;
  st->count = st->pos = 0;
  sj_pipe_close(p);
}

static const char *arg_text(FunctionCallInfo fcinfo, int i, const char *name) {
  if (PG_ARGISNULL(i))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("simjoin: %s must not be NULL", name)));
  return text_to_cstring(PG_GETARG_TEXT_PP(i));
}

/* First call: reads the points (SPI) and starts the join. */
static join_state *start_join(FunctionCallInfo fcinfo, bool self, MemoryContext mcxt) {
  int argi = self ? 1 : 2;
  const char *qa = arg_text(fcinfo, 0, self ? "points" : "points_a");
  const char *qb = self ? NULL : arg_text(fcinfo, 1, "points_b");
  const char *metric_name = arg_text(fcinfo, argi + 1, "metric");
  const char *backend_name = arg_text(fcinfo, argi + 2, "backend");
  double eps;
  int metric = sj_parse_metric(metric_name);
  int backend = sj_parse_backend(backend_name);
  join_state *st = palloc0(sizeof *st);
  size_t *charged = palloc0(sizeof(size_t));
  uint64_t threads;
  char err[1024];
  TupleDesc td;

  if (PG_ARGISNULL(argi))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("simjoin: eps must not be NULL")));
  eps = PG_GETARG_FLOAT8(argi);
  if (metric < 0)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: unknown metric \"%s\" (euclidean, manhattan, chebyshev, cosine or "
                           "haversine)", metric_name)));
  if (metric != sj_parse_metric("haversine") &&
      (strstr(qa, SJ_GEOGRAPHY_MARK) || (qb && strstr(qb, SJ_GEOGRAPHY_MARK))))
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: geography points are joined on the sphere: use metric 'haversine' "
                           "(eps in metres)")));
  if (backend < 0)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: unknown backend \"%s\" (auto, cpu or gpu)", backend_name)));
  if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
    elog(ERROR, "simjoin: the function must return a composite type");
  st->tupdesc = BlessTupleDesc(td);
  st->self = self;
  st->pa = palloc0(sizeof(points));
  st->pb = palloc0(sizeof(points));
  st->pa->what = self ? "points" : "points_a";
  st->pb->what = "points_b";
  st->pa->charged = st->pb->charged = charged;

  if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "simjoin: SPI_connect failed");
  read_points(qa, st->pa, mcxt);
  if (!self) read_points(qb, st->pb, mcxt);
  SPI_finish();
  if (metric == sj_parse_metric("haversine")) {
    /* A geometry column's (x, y) is (longitude, latitude): the engine takes (latitude,
     * longitude). */
    swap_columns(st->pa, strstr(qa, SJ_GEOMETRY_MARK) != NULL);
    if (!self) swap_columns(st->pb, strstr(qb, SJ_GEOMETRY_MARK) != NULL);
  }
  check_unique(st->pa);
  if (!self) check_unique(st->pb);

  if (!self && st->pa->n > 0 && st->pb->n > 0 && st->pa->dim != st->pb->dim)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: points_a has %zu dimensions and points_b has %zu", st->pa->dim, st->pb->dim)));
  st->dim = st->pa->dim ? st->pa->dim : st->pb->dim;
  if (st->dim == 0) st->dim = 1; /* an empty input: the join checks eps and returns nothing */

  if (!self && !st->pb->coords) { /* an empty points_b: still a join, not a self-join */
    st->pb->coords = malloc(sizeof(double));
    if (!st->pb->coords) ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("simjoin: out of memory")));
  }

  /* Registered before the join starts: from here on, whatever ends the statement closes it. */
  st->close_cb.func = close_join;
  st->close_cb.arg = st;
  MemoryContextRegisterResetCallback(mcxt, &st->close_cb);

  {
    /* 0: the machine's cores, never more than simjoin.max_threads (a setting above the
     * cores would only add threads that wait). */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int want = sj_threads == 0 ? (int)(cores > 0 ? cores : 1) : sj_threads;
    threads = (uint64_t)(want > sj_max_threads ? sj_max_threads : want);
  }
  /* The pipe owns the coordinates from here on, whatever happens. */
  if (sj_pipe_start(&st->pipe, st->pa->coords, st->pa->n, self ? NULL : st->pb->coords, st->pb->n,
                    st->dim, eps, metric, backend, threads, err, sizeof err) != 0) {
    st->pa->coords = st->pb->coords = NULL;
    ereport(ERROR, (errcode(ERRCODE_EXTERNAL_ROUTINE_EXCEPTION), errmsg("simjoin: %s", err)));
  }
  st->pa->coords = st->pb->coords = NULL;
  return st;
}

/* Waits for the next chunk of pairs: true with st->pairs set, false at the end. A cancel,
 * statement_timeout or error while waiting stops the join first (every thread of it), then
 * goes on. */
static bool next_chunk(join_state *st) {
  volatile bool more = false;
  PG_TRY();
  {
    for (;;) {
      int r;
      CHECK_FOR_INTERRUPTS();
      r = sj_pipe_next(st->pipe, &st->pairs, &st->count, POLL_MS);
      if (r == SJ_WAIT) continue;
      if (r == SJ_CHUNK) {
        if (st->count == 0) continue;
        st->pos = 0;
        more = true;
        break;
      }
      if (r == SJ_ERROR)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("simjoin: %s", sj_pipe_error(st->pipe))));
      break; /* SJ_END */
    }
  }
  PG_CATCH();
  {
    close_join(st);
    PG_RE_THROW();
  }
  PG_END_TRY();
  if (!more) close_join(st);
  return more;
}

static Datum run_join(FunctionCallInfo fcinfo, bool self) {
  FuncCallContext *funcctx;
  join_state *st;
  uint32_t i, j;
  int64 x, y;
  Datum values[3];
  bool nulls[3] = {false, false, false};

  if (SRF_IS_FIRSTCALL()) {
    MemoryContext old;
    funcctx = SRF_FIRSTCALL_INIT();
    old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
    funcctx->user_fctx = start_join(fcinfo, self, funcctx->multi_call_memory_ctx);
    MemoryContextSwitchTo(old);
  }
  funcctx = SRF_PERCALL_SETUP();
  st = funcctx->user_fctx;
  if (st->pos >= st->count && (!st->pipe || !next_chunk(st))) SRF_RETURN_DONE(funcctx);
  i = st->pairs[2 * st->pos];
  j = st->pairs[2 * st->pos + 1];
  st->pos++;
  x = st->pa->ids[i];
  y = self ? st->pa->ids[j] : st->pb->ids[j];
  if (self && x > y) {
    int64 t = x;
    x = y;
    y = t;
  }
  values[0] = Int64GetDatum(x);
  values[1] = Int64GetDatum(y);
  values[2] = Float8GetDatum(sj_pipe_distance(st->pipe, i, j));
  SRF_RETURN_NEXT(funcctx, HeapTupleGetDatum(heap_form_tuple(st->tupdesc, values, nulls)));
}

PG_FUNCTION_INFO_V1(simjoin_self_join_pg);
Datum simjoin_self_join_pg(PG_FUNCTION_ARGS) { return run_join(fcinfo, true); }

PG_FUNCTION_INFO_V1(simjoin_join_pg);
Datum simjoin_join_pg(PG_FUNCTION_ARGS) { return run_join(fcinfo, false); }

/* simjoin_points_query(tab regclass, id text, coords text[]): the text of the query
 * "SELECT id, c1, c2, ... FROM schema.tab", every name quoted, for the functions that take
 * a table and column names instead of query text (no SQL is built from the caller's text). */
/* The PostGIS type `typ` is named `name` ("geometry", "geography"), in whatever schema:
 * its schema's name in *nsp when so. */
static bool postgis_type(Oid typ, const char *name, char **nsp) {
  HeapTuple tp = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typ));
  bool is;
  if (!HeapTupleIsValid(tp)) return false;
  is = strcmp(NameStr(((Form_pg_type)GETSTRUCT(tp))->typname), name) == 0;
  if (is) *nsp = get_namespace_name(((Form_pg_type)GETSTRUCT(tp))->typnamespace);
  ReleaseSysCache(tp);
  return is;
}

PG_FUNCTION_INFO_V1(simjoin_points_query_pg);
Datum simjoin_points_query_pg(PG_FUNCTION_ARGS) {
  Oid relid;
  char *rel, *nsp;
  Datum *elems;
  bool *elem_nulls;
  int n, k;
  StringInfoData buf;
  bool geography = false, geometry = false;
  static const char *const names[] = {"the table", "the id column", "coords"};
  for (k = 0; k < 3; k++)
    if (PG_ARGISNULL(k))
      ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("simjoin: %s must not be NULL", names[k])));
  relid = PG_GETARG_OID(0);
  rel = get_rel_name(relid);
  if (!rel)
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("simjoin: no relation with OID %u", relid)));
  nsp = get_namespace_name(get_rel_namespace(relid));
  deconstruct_array(PG_GETARG_ARRAYTYPE_P(2), TEXTOID, -1, false, TYPALIGN_INT, &elems, &elem_nulls, &n);
  if (n == 0)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: coords must name at least one column")));
  initStringInfo(&buf);
  appendStringInfo(&buf, "SELECT %s", quote_identifier(text_to_cstring(PG_GETARG_TEXT_PP(1))));
  for (k = 0; k < n; k++) {
    if (elem_nulls[k])
      ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                      errmsg("simjoin: coords must not hold NULL (element %d)", k + 1)));
    {
      /* A PostGIS geometry column of points gives its x and y (ST_X, ST_Y: an error for
       * anything but a point). A geography is longitude and latitude on the sphere, not
       * plane coordinates: refused rather than joined as if it were. */
      const char *col = TextDatumGetCString(elems[k]);
      AttrNumber att = get_attnum(relid, col);
      Oid typ = att == InvalidAttrNumber ? InvalidOid : get_atttype(relid, att);
      char *gis = NULL;
      if (OidIsValid(typ) && postgis_type(typ, "geometry", &gis)) {
        const char *g = quote_identifier(gis), *c = quote_identifier(col);
        appendStringInfo(&buf, ", %s.ST_X(%s), %s.ST_Y(%s)", g, c, g, c);
        geometry = n == 1;
      } else if (OidIsValid(typ) && postgis_type(typ, "geography", &gis)) {
        /* Latitude and longitude in degrees, for metric 'haversine' (metres on the sphere,
         * as ST_DWithin(geography, geography, eps, false)); the marker lets the join refuse
         * any other metric. */
        const char *g = quote_identifier(gis), *c = quote_identifier(col);
        appendStringInfo(&buf, ", %s.ST_Y(%s::%s.geometry), %s.ST_X(%s::%s.geometry)", g, c, g, g, c, g);
        geography = true;
      } else {
        appendStringInfo(&buf, ", %s", quote_identifier(col));
      }
    }
  }
  appendStringInfo(&buf, " FROM %s", quote_qualified_identifier(nsp, rel));
  if (geography) appendStringInfoString(&buf, " " SJ_GEOGRAPHY_MARK);
  if (geometry) appendStringInfoString(&buf, " " SJ_GEOMETRY_MARK);
  PG_RETURN_TEXT_P(cstring_to_text(buf.data));
}

/* The planner's row estimate for simjoin_self_join_rows / simjoin_join_rows (their SUPPORT
 * function). When the points come from a table (the table-and-columns form: the argument is
 * simjoin_points_query(<constant table>, ...)), the estimate is the table's row count from
 * its statistics (pg_class.reltuples), i.e. about one pair per point, the larger input's for
 * a join of two; otherwise (query text, a table never analysed) the functions' ROWS. */
static double input_rows(Node *arg) {
  FuncExpr *f;
  Const *c;
  HeapTuple tp;
  double rows;
  const char *name;
  if (!arg || !IsA(arg, FuncExpr)) return -1;
  f = (FuncExpr *)arg;
  name = get_func_name(f->funcid);
  if (!name || strcmp(name, "simjoin_points_query") != 0 || list_length(f->args) != 3) return -1;
  c = (Const *)linitial(f->args);
  if (!IsA(c, Const) || c->constisnull || c->consttype != REGCLASSOID) return -1;
  tp = SearchSysCache1(RELOID, c->constvalue);
  if (!HeapTupleIsValid(tp)) return -1;
  rows = ((Form_pg_class)GETSTRUCT(tp))->reltuples;
  ReleaseSysCache(tp);
  return rows;
}

PG_FUNCTION_INFO_V1(simjoin_rows_support);
Datum simjoin_rows_support(PG_FUNCTION_ARGS) {
  Node *raw = (Node *)PG_GETARG_POINTER(0);
  if (IsA(raw, SupportRequestRows)) {
    SupportRequestRows *req = (SupportRequestRows *)raw;
    if (req->node && IsA(req->node, FuncExpr)) {
      List *args = ((FuncExpr *)req->node)->args;
      double na = input_rows(list_length(args) >= 1 ? (Node *)linitial(args) : NULL);
      double nb = list_length(args) == 5 ? input_rows((Node *)lsecond(args)) : 0;
      if (na >= 0 && nb >= 0) {
        req->rows = Max(Max(na, nb), 1.0);
        PG_RETURN_POINTER(req);
      }
    }
  }
  PG_RETURN_POINTER(NULL);
}
