-- awa_django migration 0011: least-privilege roles (issue 19).
--
-- An application role must be able to enqueue (also into a queue and priority never seen
-- before, which creates a lane and its sequence) and resolve callbacks without INSERT on the ring
-- tables (which would let it write rows no validation ever saw) and without CREATE on the schema.
-- The entry points that do that run as their owner (the role that ran migrate):
--
--   awa.ensure_lanes_v1      creates the lanes and sequences of a (queue, priority)
--   awa.enqueue_one_v1/v2/v3, awa.enqueue_v1
--                            validate every request, then append it (ready or deferred)
--   awa.callback_resolve_v1/v2, awa.callback_extend_v1, awa.callback_receive_v1
--                            resolve or extend a callback the caller names by its id
--
-- Each is SECURITY DEFINER with search_path = pg_catalog, pg_temp (every awa object in them and
-- in what they call is schema-qualified; pg_temp last, so a caller's temporary objects are
-- never found first), and EXECUTE is revoked from PUBLIC: only the roles the DBA grants it to
-- (manage.py awa_roles) and the owner can call them. Nothing else is SECURITY DEFINER: every
-- other function runs with its caller's privileges, so table privileges decide what a role can
-- do through it.
--
-- awa._lane_for_v1 is redefined in place with the same signature and the same results: a lane
-- named in awa.xact_lanes (the record of the lanes this transaction holds, a setting any caller
-- can change) is used only when this transaction really holds its lock (taking an advisory lock
-- again that the transaction holds succeeds at once), so a forged setting can no longer make a
-- SECURITY DEFINER enqueue append to a lane without its lock.

CREATE OR REPLACE FUNCTION awa._lane_for_v1(p_queue text, p_priority integer, p_wait boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_lanes integer[];
    v_held text := COALESCE(current_setting('awa.xact_lanes', true), '');
    v_n integer;
    v_home integer;
    v_lane integer;
    i integer;
BEGIN
    SELECT array_agg(l.lane_id ORDER BY l.shard) INTO v_lanes
    FROM awa.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority;
    IF v_lanes IS NULL THEN
        PERFORM awa.ensure_lanes_v1(p_queue, p_priority);
        SELECT array_agg(l.lane_id ORDER BY l.shard) INTO v_lanes
        FROM awa.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority;
    END IF;
    IF v_held <> '' THEN
        -- A held lane's lock is taken again at once (the transaction holds it); a lane named
        -- but not held is taken only when free (then it is held), else passed over.
        FOR v_lane IN
            SELECT x.h::integer
            FROM unnest(string_to_array(v_held, ',')) WITH ORDINALITY AS x(h, ord)
            -- Entries that are not lane ids are passed over (a session-level value, left by
            -- another client of a pooled connection, or forged, is anyone's to set).
            WHERE x.h ~ '^[0-9]{1,9}$' AND x.h::integer = ANY (v_lanes)
            ORDER BY x.ord
        LOOP
            IF pg_try_advisory_xact_lock(4282177, v_lane) THEN
                RETURN v_lane;
            END IF;
        END LOOP;
    END IF;
    v_n := cardinality(v_lanes);
    v_home := pg_backend_pid() % v_n;
    v_lane := NULL;
    FOR i IN 0..(v_n - 1) LOOP
        IF pg_try_advisory_xact_lock(4282177, v_lanes[((v_home + i) % v_n) + 1]) THEN
            v_lane := v_lanes[((v_home + i) % v_n) + 1];
            EXIT;
        END IF;
    END LOOP;
    IF v_lane IS NULL THEN
        IF NOT p_wait THEN
            RETURN NULL;
        END IF;
        v_lane := v_lanes[v_home + 1];
        PERFORM pg_advisory_xact_lock(4282177, v_lane);
    END IF;
    PERFORM set_config('awa.xact_lanes',
                       CASE WHEN v_held = '' THEN v_lane::text ELSE v_held || ',' || v_lane END,
                       true);
    RETURN v_lane;
END
$$;

ALTER FUNCTION awa.ensure_lanes_v1(text, integer, integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.enqueue_one_v1(text, text, integer, jsonb, integer, timestamptz,
    double precision, double precision, jsonb, text[], jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.enqueue_one_v2(text, text, integer, jsonb, integer, timestamptz,
    double precision, double precision, jsonb, text[], integer, integer, integer, integer, integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.enqueue_one_v3(text, text, integer, jsonb, integer, timestamptz,
    double precision, double precision, jsonb, text[], integer, integer, integer, integer, integer,
    boolean, text, double precision, text[], boolean)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.enqueue_v1(jsonb, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.callback_resolve_v1(uuid, jsonb, jsonb, boolean, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.callback_resolve_v2(uuid, jsonb, jsonb, boolean, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.callback_extend_v1(uuid, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.callback_receive_v1(uuid, bigint, double precision, text, bytea, jsonb, jsonb,
    boolean, double precision, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE EXECUTE ON FUNCTION
    awa.ensure_lanes_v1(text, integer, integer),
    awa.enqueue_one_v1(text, text, integer, jsonb, integer, timestamptz, double precision,
        double precision, jsonb, text[], jsonb),
    awa.enqueue_one_v2(text, text, integer, jsonb, integer, timestamptz, double precision,
        double precision, jsonb, text[], integer, integer, integer, integer, integer),
    awa.enqueue_one_v3(text, text, integer, jsonb, integer, timestamptz, double precision,
        double precision, jsonb, text[], integer, integer, integer, integer, integer, boolean,
        text, double precision, text[], boolean),
    awa.enqueue_v1(jsonb, jsonb),
    awa.callback_resolve_v1(uuid, jsonb, jsonb, boolean, double precision),
    awa.callback_resolve_v2(uuid, jsonb, jsonb, boolean, double precision),
    awa.callback_extend_v1(uuid, double precision),
    awa.callback_receive_v1(uuid, bigint, double precision, text, bytea, jsonb, jsonb, boolean,
        double precision, double precision)
FROM PUBLIC;
