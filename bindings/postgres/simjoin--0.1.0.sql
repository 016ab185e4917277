\echo Use "CREATE EXTENSION simjoin" to load this file. \quit

-- points: a query whose first column is an integer id and whose other columns are the
-- coordinates (one numeric column per dimension, or one float8[]/float4[] column).
-- Each unordered pair within eps once, id_a < id_b. distance is recomputed in double.
CREATE FUNCTION simjoin_self_join(points text, eps float8, metric text DEFAULT 'euclidean',
                                  backend text DEFAULT 'auto')
RETURNS TABLE(id_a bigint, id_b bigint, distance float8)
AS 'MODULE_PATHNAME', 'simjoin_self_join_pg'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE ROWS 1000;

-- Every pair (a in points_a, b in points_b) within eps: id_a from points_a, id_b from points_b.
CREATE FUNCTION simjoin_join(points_a text, points_b text, eps float8,
                             metric text DEFAULT 'euclidean', backend text DEFAULT 'auto')
RETURNS TABLE(id_a bigint, id_b bigint, distance float8)
AS 'MODULE_PATHNAME', 'simjoin_join_pg'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE ROWS 1000;
