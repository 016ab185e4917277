/* Haversine joins through the C ABI: (latitude, longitude) in degrees, eps and distances in
 * metres on the options' sphere (sphere_radius, 0 = SIMJOIN_EARTH_RADIUS_M). Points one
 * degree of longitude apart on the equator are R * pi / 180 apart: a pair at eps just
 * above that and none just below, on the Earth, the unit sphere and a sphere of 2 m, for
 * the join (with distances), kNN and DBSCAN; a radius that is no radius, or one set on
 * another metric, is refused. */
#include "check.h"

static simjoin_engine *engine;

/* Whether this thread's last error message contains `what`. */
static int error_says(const char *what) {
  char buf[512];
  simjoin_last_error_message(buf, sizeof buf);
  return strstr(buf, what) != NULL;
}
static const double RAD = 3.14159265358979323846 / 180.0;

/* Pairs of the self-join of `m` at `eps` on `radius`; the one pair's distance in `*d`. */
static size_t pairs_at(const simjoin_matrix *m, double eps, double radius, double *d) {
  simjoin_options o;
  simjoin_result *res = NULL;
  const uint32_t *pairs;
  const void *dist;
  size_t count, dcount;
  simjoin_dtype dtype;
  simjoin_options_init(&o);
  o.eps = eps;
  o.metric = SIMJOIN_METRIC_HAVERSINE;
  o.sphere_radius = radius;
  o.distances = 1;
  CHECK_OK(simjoin_self_join(engine, m, &o, &res));
  CHECK_OK(simjoin_result_pairs(res, &pairs, &count));
  CHECK_OK(simjoin_result_distances(res, &dist, &dcount, &dtype));
  CHECK(dcount == count && dtype == SIMJOIN_DTYPE_F64);
  if (count == 1) {
    CHECK(pairs[0] == 0 && pairs[1] == 1);
    *d = ((const double *)dist)[0];
  }
  simjoin_result_free(res);
  return count;
}

int main(void) {
  /* (0, 0) and (0, 1): one degree along the equator; (60, 100) far from both. */
  double pts[6] = {0, 0, 0, 1, 60, 100};
  simjoin_matrix m = {pts, 3, 2, SIMJOIN_DTYPE_F64};
  double radii[3] = {0, 1, 2};
  size_t i;
  CHECK_OK(simjoin_engine_new(&engine));
  for (i = 0; i < 3; i++) {
    double r = radii[i] == 0 ? SIMJOIN_EARTH_RADIUS_M : radii[i];
    double arc = r * RAD, d = -1;
    simjoin_knn_options ko;
    simjoin_knn_result *kr = NULL;
    simjoin_dbscan_options dopts;
    size_t rows, k;
    const uint32_t *idx;
    const void *kd;
    simjoin_dtype dtype;
    int64_t labels[3];
    CHECK(pairs_at(&m, arc * (1 + 1e-9), radii[i], &d) == 1);
    CHECK(fabs(d - arc) <= 1e-12 * arc);
    CHECK(pairs_at(&m, arc * (1 - 1e-9), radii[i], &d) == 0);
    /* kNN: the nearest of (0, 0) is (0, 1), one degree away on this sphere. */
    simjoin_knn_options_init(&ko);
    ko.metric = SIMJOIN_METRIC_HAVERSINE;
    ko.sphere_radius = radii[i];
    CHECK_OK(simjoin_knn(engine, &m, NULL, 1, &ko, &kr));
    CHECK_OK(simjoin_knn_result_arrays(kr, &rows, &k, &idx, &kd, &dtype));
    CHECK(rows == 3 && k == 1 && idx[0] == 1 && dtype == SIMJOIN_DTYPE_F64);
    CHECK(fabs(((const double *)kd)[0] - arc) <= 1e-12 * arc);
    simjoin_knn_result_free(kr);
    /* DBSCAN: the two equator points a cluster at eps just above the arc, noise below. */
    simjoin_dbscan_options_init(&dopts);
    dopts.metric = SIMJOIN_METRIC_HAVERSINE;
    dopts.sphere_radius = radii[i];
    CHECK_OK(simjoin_dbscan(engine, &m, arc * (1 + 1e-9), 2, &dopts, labels, NULL, NULL));
    CHECK(labels[0] == 0 && labels[1] == 0 && labels[2] == -1);
    CHECK_OK(simjoin_dbscan(engine, &m, arc * (1 - 1e-9), 2, &dopts, labels, NULL, NULL));
    CHECK(labels[0] == -1 && labels[1] == -1 && labels[2] == -1);
  }
  /* Refused: a negative or infinite radius; a radius on a metric other than haversine. */
  {
    simjoin_options o;
    simjoin_result *res = NULL;
    simjoin_options_init(&o);
    o.eps = 1;
    o.metric = SIMJOIN_METRIC_HAVERSINE;
    o.sphere_radius = -1;
    CHECK(simjoin_self_join(engine, &m, &o, &res) == SIMJOIN_INVALID_ARGUMENT && res == NULL);
    CHECK(error_says("sphere_radius"));
    o.sphere_radius = INFINITY;
    CHECK(simjoin_self_join(engine, &m, &o, &res) == SIMJOIN_INVALID_ARGUMENT);
    o.metric = SIMJOIN_METRIC_EUCLIDEAN;
    o.sphere_radius = 1;
    CHECK(simjoin_self_join(engine, &m, &o, &res) == SIMJOIN_INVALID_ARGUMENT);
    CHECK(error_says("haversine only"));
  }
  simjoin_engine_free(engine);
  printf("haversine: ok\n");
  return 0;
}
