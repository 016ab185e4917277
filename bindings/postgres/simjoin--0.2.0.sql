\echo Use "CREATE EXTENSION simjoin" to load this file. \quit

-- One result row.
CREATE TYPE simjoin_pair AS (id_a bigint, id_b bigint, distance float8);

-- The C functions. They stream: each call hands over one pair as the join produces it
-- (value-per-call), so LIMIT, EXISTS and a cancel stop the join early. PostgreSQL runs such
-- a function row by row only in a target list (in FROM it stores the whole result first),
-- so call them through simjoin_self_join / simjoin_join below, which are inlined into the
-- calling query as a subquery with the C function in its target list.
-- STABLE: they read the database through the points queries, which run read-only in the
-- caller's snapshot (a data-modifying query is refused). PARALLEL RESTRICTED: the points
-- queries may name temporary tables, and each join uses its own threads in the leader.
-- Not STRICT: a NULL argument is an error, not an empty result. Row estimate: ROWS, or for
-- points from a table (the table-and-columns form below) its row count from its
-- statistics, about one pair per point (simjoin_rows_support).
CREATE FUNCTION simjoin_rows_support(internal)
RETURNS internal
AS 'MODULE_PATHNAME', 'simjoin_rows_support'
LANGUAGE C STRICT STABLE PARALLEL SAFE;

CREATE FUNCTION simjoin_self_join_rows(points text, eps float8, metric text, backend text)
RETURNS SETOF simjoin_pair
AS 'MODULE_PATHNAME', 'simjoin_self_join_pg'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL RESTRICTED ROWS 10000
SUPPORT simjoin_rows_support;

CREATE FUNCTION simjoin_join_rows(points_a text, points_b text, eps float8, metric text,
                                  backend text)
RETURNS SETOF simjoin_pair
AS 'MODULE_PATHNAME', 'simjoin_join_pg'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL RESTRICTED ROWS 10000
SUPPORT simjoin_rows_support;

-- points: a read-only query whose first column is a unique integer id and whose other
-- columns are the coordinates (one numeric column per dimension, or one float8[]/float4[]
-- column). Each unordered pair within eps once, id_a < id_b. distance is recomputed in
-- double. Settings: simjoin.threads (capped by simjoin.max_threads), simjoin.max_memory.
CREATE FUNCTION simjoin_self_join(points text, eps float8, metric text DEFAULT 'euclidean',
                                  backend text DEFAULT 'auto')
RETURNS TABLE(id_a bigint, id_b bigint, distance float8)
LANGUAGE sql STABLE CALLED ON NULL INPUT PARALLEL RESTRICTED ROWS 10000
AS $$
  SELECT (r).id_a, (r).id_b, (r).distance
  FROM (SELECT @extschema@.simjoin_self_join_rows(points, eps, metric, backend) AS r) s
$$;

-- Every pair (a in points_a, b in points_b) within eps: id_a from points_a, id_b from points_b.
CREATE FUNCTION simjoin_join(points_a text, points_b text, eps float8,
                             metric text DEFAULT 'euclidean', backend text DEFAULT 'auto')
RETURNS TABLE(id_a bigint, id_b bigint, distance float8)
LANGUAGE sql STABLE CALLED ON NULL INPUT PARALLEL RESTRICTED ROWS 10000
AS $$
  SELECT (r).id_a, (r).id_b, (r).distance
  FROM (SELECT @extschema@.simjoin_join_rows(points_a, points_b, eps, metric, backend) AS r) s
$$;

-- Points from a table (or view) and column names instead of query text: `id` a unique
-- integer column, `coords` the coordinate columns (one per dimension, or one array column).
-- Every name is quoted, so no SQL is built from the caller's text.
--   SELECT * FROM simjoin_self_join('shops', 'id', ARRAY['x', 'y'], 1.0);
CREATE FUNCTION simjoin_points_query(tab regclass, id text, coords text[])
RETURNS text
AS 'MODULE_PATHNAME', 'simjoin_points_query_pg'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL SAFE;

CREATE FUNCTION simjoin_self_join(tab regclass, id text, coords text[], eps float8,
                                  metric text DEFAULT 'euclidean', backend text DEFAULT 'auto')
RETURNS TABLE(id_a bigint, id_b bigint, distance float8)
LANGUAGE sql STABLE CALLED ON NULL INPUT PARALLEL RESTRICTED ROWS 10000
AS $$
  SELECT (r).id_a, (r).id_b, (r).distance
  FROM (SELECT @extschema@.simjoin_self_join_rows(@extschema@.simjoin_points_query(tab, id, coords),
                                                  eps, metric, backend) AS r) s
$$;

CREATE FUNCTION simjoin_join(tab_a regclass, id_a text, coords_a text[], tab_b regclass,
                             id_b text, coords_b text[], eps float8,
                             metric text DEFAULT 'euclidean', backend text DEFAULT 'auto')
RETURNS TABLE(id_a bigint, id_b bigint, distance float8)
LANGUAGE sql STABLE CALLED ON NULL INPUT PARALLEL RESTRICTED ROWS 10000
AS $$
  SELECT (r).id_a, (r).id_b, (r).distance
  FROM (SELECT @extschema@.simjoin_join_rows(@extschema@.simjoin_points_query(tab_a, id_a, coords_a),
                                             @extschema@.simjoin_points_query(tab_b, id_b, coords_b),
                                             eps, metric, backend) AS r) s
$$;
