-- Unapplies awa_django migration 0011 (sql/migrations/0011_roles.sql): awa._lane_for_v1 gets
-- its body of migration 0002 back, and the entry points 0011 made SECURITY DEFINER run with
-- their callers' privileges again, executable by PUBLIC as before. Grants made by
-- manage.py awa_roles stay.

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
        SELECT h::integer INTO v_lane
        FROM unnest(string_to_array(v_held, ',')) AS h
        WHERE h::integer = ANY (v_lanes)
        LIMIT 1;
        IF v_lane IS NOT NULL THEN
            RETURN v_lane;
        END IF;
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
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION awa.enqueue_one_v1(text, text, integer, jsonb, integer, timestamptz,
    double precision, double precision, jsonb, text[], jsonb)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION awa.enqueue_one_v2(text, text, integer, jsonb, integer, timestamptz,
    double precision, double precision, jsonb, text[], integer, integer, integer, integer, integer)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION awa.enqueue_one_v3(text, text, integer, jsonb, integer, timestamptz,
    double precision, double precision, jsonb, text[], integer, integer, integer, integer, integer,
    boolean, text, double precision, text[], boolean)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION awa.enqueue_v1(jsonb, jsonb)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION awa.callback_resolve_v1(uuid, jsonb, jsonb, boolean, double precision)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION awa.callback_resolve_v2(uuid, jsonb, jsonb, boolean, double precision)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION awa.callback_extend_v1(uuid, double precision)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION awa.callback_receive_v1(uuid, bigint, double precision, text, bytea, jsonb, jsonb,
    boolean, double precision, double precision)
    SECURITY INVOKER RESET search_path;

GRANT EXECUTE ON FUNCTION
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
TO PUBLIC;
