/* PostgreSQL extension: simjoin_self_join(points, eps, metric, backend) and
 * simjoin_join(points_a, points_b, eps, metric, backend), set-returning functions in
 * materialize mode (the rows go into a tuplestore that spills to disk beyond work_mem).
 *
 * Every simjoin call is in ../common/sj_pipe.c: the join runs on threads of its own and
 * this file, on the backend's thread, only pops chunks of pairs from a bounded queue. So
 * no PostgreSQL function runs on a simjoin thread, and an ereport/longjmp (an error, a
 * cancel, statement_timeout) never crosses simjoin's frames: the PG_CATCH below stops the
 * join, and the error goes on. */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#include "sj_pipe.h"

PG_MODULE_MAGIC;

/* simjoin.threads: CPU worker threads per join (0 = all cores). */
static int sj_threads = 0;

void _PG_init(void);
void _PG_init(void) {
  DefineCustomIntVariable("simjoin.threads", "CPU worker threads of a simjoin join (0 = all cores).",
                          NULL, &sj_threads, 0, 0, 1024, PGC_USERSET, 0, NULL, NULL, NULL);
}

/* How long a cancelled join may take to stop before it is left to end in the background. */
#define STOP_WAIT_MS 2000
/* How often the backend looks for interrupts while it waits for pairs. */
#define POLL_MS 20

/* One input point set, read from the user's query. `coords` is malloc'd (the join thread
 * owns it once the join starts); a memory context callback frees it if an error comes first. */
typedef struct points {
  const char *what; /* "points", "points_a", "points_b" */
  int64 *ids;       /* palloc'd in the caller's context */
  double *coords;
  size_t n, cap, dim;
  MemoryContextCallback free_cb;
} points;

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
  while (cap < rows_needed) cap *= 2;
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
    SPI_cursor_fetch(portal, true, 10000);
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
}

static Datum run_join(FunctionCallInfo fcinfo, bool self) {
  ReturnSetInfo *rsinfo = (ReturnSetInfo *)fcinfo->resultinfo;
  MemoryContext mcxt = CurrentMemoryContext;
  int argi = self ? 1 : 2;
  double eps = PG_GETARG_FLOAT8(argi);
  char *metric_name = text_to_cstring(PG_GETARG_TEXT_PP(argi + 1));
  char *backend_name = text_to_cstring(PG_GETARG_TEXT_PP(argi + 2));
  int metric = sj_parse_metric(metric_name);
  int backend = sj_parse_backend(backend_name);
  /* In mcxt, not on the stack: their reset callbacks run after this function returns. */
  points *pa = MemoryContextAllocZero(mcxt, sizeof(points));
  points *pb = MemoryContextAllocZero(mcxt, sizeof(points));
  sj_pipe *volatile pipe = NULL;
  char err[1024];
  const double *ca, *cb;
  size_t dim;

  pa->what = self ? "points" : "points_a";
  pb->what = "points_b";
  if (metric < 0)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: unknown metric \"%s\" (euclidean, manhattan or chebyshev)", metric_name)));
  if (backend < 0)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: unknown backend \"%s\" (auto, cpu or gpu)", backend_name)));

  InitMaterializedSRF(fcinfo, 0);

  if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "simjoin: SPI_connect failed");
  read_points(text_to_cstring(PG_GETARG_TEXT_PP(0)), pa, mcxt);
  if (!self) read_points(text_to_cstring(PG_GETARG_TEXT_PP(1)), pb, mcxt);
  SPI_finish();

  if (!self && pa->n > 0 && pb->n > 0 && pa->dim != pb->dim)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("simjoin: points_a has %zu dimensions and points_b has %zu", pa->dim, pb->dim)));
  dim = pa->dim ? pa->dim : pb->dim;
  if (dim == 0) dim = 1; /* an empty input: the join checks eps and returns nothing */

  if (!self && !pb->coords) { /* an empty points_b: still a join, not a self-join */
    pb->coords = malloc(sizeof(double));
    if (!pb->coords) ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("simjoin: out of memory")));
  }

  /* The pipe owns the coordinates from here on, whatever happens. */
  if (sj_pipe_start((sj_pipe **)&pipe, pa->coords, pa->n, self ? NULL : pb->coords, pb->n, dim, eps, metric,
                    backend, (uint64_t)sj_threads, err, sizeof err) != 0) {
    pa->coords = pb->coords = NULL;
    ereport(ERROR, (errcode(ERRCODE_EXTERNAL_ROUTINE_EXCEPTION), errmsg("simjoin: %s", err)));
  }
  pa->coords = pb->coords = NULL;
  ca = sj_pipe_a(pipe);
  cb = sj_pipe_b(pipe);

  PG_TRY();
  {
    for (;;) {
      const uint32_t *pairs;
      size_t count, k;
      int r;
      CHECK_FOR_INTERRUPTS();
      r = sj_pipe_next(pipe, &pairs, &count, POLL_MS);
      if (r == SJ_WAIT) continue;
      if (r == SJ_END) break;
      if (r == SJ_ERROR)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("simjoin: %s", sj_pipe_error(pipe))));
      for (k = 0; k < count; k++) {
        uint32_t i = pairs[2 * k], j = pairs[2 * k + 1];
        Datum values[3];
        bool nulls[3] = {false, false, false};
        int64 x = pa->ids[i], y = self ? pa->ids[j] : pb->ids[j];
        if (self && x > y) {
          int64 t = x;
          x = y;
          y = t;
        }
        values[0] = Int64GetDatum(x);
        values[1] = Int64GetDatum(y);
        values[2] = Float8GetDatum(sj_distance(metric, ca + (size_t)i * dim, cb + (size_t)j * dim, dim));
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
        if ((k & 4095) == 4095) CHECK_FOR_INTERRUPTS();
      }
    }
  }
  PG_FINALLY();
  {
    /* Error, cancel or the end: stop the join and let go of it (no simjoin frame is on
     * this thread, so the longjmp that brought us here crossed none). */
    sj_pipe_close(pipe, STOP_WAIT_MS);
  }
  PG_END_TRY();
  return (Datum)0;
}

PG_FUNCTION_INFO_V1(simjoin_self_join_pg);
Datum simjoin_self_join_pg(PG_FUNCTION_ARGS) { return run_join(fcinfo, true); }

PG_FUNCTION_INFO_V1(simjoin_join_pg);
Datum simjoin_join_pg(PG_FUNCTION_ARGS) { return run_join(fcinfo, false); }
