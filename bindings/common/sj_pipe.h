/* sj_pipe: runs one simjoin streaming join on a thread of its own and hands the pairs to
 * the caller's thread through a small bounded queue. Shared by the PostgreSQL and SQLite
 * extensions; every simjoin call of both lives in sj_pipe.c.
 *
 * Why a thread: simjoin calls its streaming callback from its own worker threads, and a
 * database engine's runtime (PostgreSQL's memory contexts, ereport/longjmp, interrupts;
 * SQLite's connection) must only be touched from the caller's thread. So the callback only
 * copies a chunk into the queue (malloc, memcpy, a mutex) and never calls into the
 * database; the caller's thread pops chunks, builds rows and checks for cancellation while
 * waiting. A longjmp on the caller's thread therefore never crosses simjoin's frames: they
 * are on other threads. All signals are blocked on the join's threads, so the database's
 * signal handlers (cancel, statement_timeout) run on the caller's thread.
 *
 * Memory: the queue holds at most SJ_PIPE_MAX_CHUNKS chunks (the join waits when it is
 * full), so results are never held whole.
 *
 * Stopping: each join has a simjoin_control. sj_pipe_cancel (async-signal-safe) asks the
 * engine to stop wherever the join is (planning, index build, the join itself, even when
 * it finds no pairs); sj_pipe_close cancels and then waits until the join call has
 * returned and its thread has been joined, so a database call never returns while a join
 * of its still runs. The engine stops a cancelled CPU join within milliseconds. */
#ifndef SJ_PIPE_H
#define SJ_PIPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct sj_pipe sj_pipe;

enum { SJ_END = 0, SJ_CHUNK = 1, SJ_WAIT = 2, SJ_ERROR = -1 };

/* Metric and backend names ("euclidean", "manhattan", "chebyshev", "cosine", "haversine"; "auto", "cpu", "gpu"),
 * case-insensitive. Return -1 for an unknown name. */
int sj_parse_metric(const char *name);
int sj_parse_backend(const char *name);

/* The distance of the pair (x, y) in double: sqrt of the sum of squares (euclidean), sum of
 * |d| (manhattan), max |d| (chebyshev), 1 - cos (cosine) or metres on the Earth (haversine:
 * (latitude, longitude) in degrees), by src/metric.rs's rules. */
double sj_distance(int metric, const double *x, const double *y, size_t dim);

/* Whether `ids` has a value twice: 1 with *dup set to it, 0 if all differ, -1 out of
 * memory. O(n) when the ids ascend, else a sorted copy. */
int sj_find_duplicate(const int64_t *ids, size_t n, int64_t *dup);

/* Starts a join: a self-join of `a` when `b` is NULL, else a join b. `a` and `b` are
 * malloc'd row-major double arrays of `na`/`nb` rows of `dim` columns; the pipe takes
 * ownership of both in every case (they are freed when the pipe and the join are done).
 * `threads` = 0: all cores. Engines (one per thread count, each with its thread pool) are
 * kept per process; when SJ_MAX_ENGINES exist, an idle one is freed to make room.
 * Returns 0 and sets *out, or -1 with a message in err. */
int sj_pipe_start(sj_pipe **out, double *a, size_t na, double *b, size_t nb, size_t dim,
                  double eps, int metric, int backend, uint64_t threads, char *err,
                  size_t errlen);

/* The distance of pair (i, j) of this join (row i of a, row j of b or a), as sj_distance
 * gives it; haversine's from unit vectors made once (valid until sj_pipe_close; call it from
 * the thread that started the pipe). */
double sj_pipe_distance(const sj_pipe *p, size_t i, size_t j);

/* The coordinates given to sj_pipe_start (valid until sj_pipe_close). */
const double *sj_pipe_a(const sj_pipe *p);
const double *sj_pipe_b(const sj_pipe *p);

/* Waits at most timeout_ms for the next chunk. SJ_CHUNK: *pairs holds *count pairs
 * (i, j, i, j, ...), valid until the next call; SJ_END: the join finished and every pair
 * was handed out; SJ_ERROR: the join failed (sj_pipe_error has the message); SJ_WAIT:
 * nothing arrived yet. */
int sj_pipe_next(sj_pipe *p, const uint32_t **pairs, size_t *count, int timeout_ms);

/* The engine's message after SJ_ERROR. */
const char *sj_pipe_error(const sj_pipe *p);

/* Asks the join to stop (simjoin_control_cancel: one atomic store). Async-signal-safe and
 * callable from any thread; returns at once. NULL is fine. */
void sj_pipe_cancel(sj_pipe *p);

/* Stops the join (cancels its control, and the streaming callback answers "stop"), waits
 * until the join call has returned and its thread is joined, and frees everything. Never
 * detaches a running join. NULL is fine. Returns 1 when the join had already ended on its
 * own, 0 when it was stopped. With SIMJOIN_PIPE_DEBUG set in the environment, one line per
 * stopped join goes to stderr: "sj_pipe: stop asked S s into the join (stage X, F%),
 * join ended T s later, N callbacks". */
int sj_pipe_close(sj_pipe *p);

#endif
