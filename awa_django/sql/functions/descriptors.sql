-- Descriptors (docs/descriptors.md): the queues and job kinds declared in code, reported by
-- each worker process when it starts and on its runtime refresh; whether live processes
-- declare each one, and agree on it, is read from awa.runtime_instances (awa.descriptor_status).

-- Why one reported descriptor is refused, or NULL when it is valid: an object with what
-- ("queue" or "kind"), name (a queue name, or a kind of 1 to 255 characters without control
-- characters), hash (64 hex digits), and optional label (up to 200 characters), description
-- (4,000), owner (200) and links (an object of up to 20 names of up to 100 characters to
-- http(s) URLs of up to 2,000 printable ASCII characters: whatever the database's locale).
CREATE OR REPLACE FUNCTION awa._descriptor_problem_v1(p_item jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT CASE
        WHEN jsonb_typeof(p_item) IS DISTINCT FROM 'object' THEN 'not an object'
        WHEN NOT COALESCE(p_item ->> 'what' IN ('queue', 'kind'), false)
            THEN 'what: must be "queue" or "kind"'
        WHEN jsonb_typeof(p_item -> 'name') IS DISTINCT FROM 'string' THEN 'name: must be text'
        WHEN p_item ->> 'what' = 'queue' AND NOT awa.valid_queue_name(p_item ->> 'name')
            THEN 'name: not a queue name ([a-z0-9_.-]{1,63})'
        WHEN p_item ->> 'what' = 'kind'
             AND (length(p_item ->> 'name') NOT BETWEEN 1 AND 255
                  OR btrim(p_item ->> 'name') = ''
                  OR (p_item ->> 'name') ~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]')
            THEN 'name: not a job kind (1-255 characters, no control characters)'
        WHEN NOT COALESCE((p_item ->> 'hash') ~ '^[0-9a-f]{64}$', false)
            THEN 'hash: must be 64 hex digits'
        WHEN jsonb_typeof(p_item -> 'label') NOT IN ('string', 'null')
             OR length(p_item ->> 'label') > 200 THEN 'label: text of up to 200 characters'
        WHEN jsonb_typeof(p_item -> 'description') NOT IN ('string', 'null')
             OR length(p_item ->> 'description') > 4000
            THEN 'description: text of up to 4000 characters'
        WHEN jsonb_typeof(p_item -> 'owner') NOT IN ('string', 'null')
             OR length(p_item ->> 'owner') > 200 THEN 'owner: text of up to 200 characters'
        WHEN jsonb_typeof(p_item -> 'links') NOT IN ('object', 'null')
            THEN 'links: an object of names to URLs'
        WHEN jsonb_typeof(p_item -> 'links') = 'object' AND (
                (SELECT count(*) FROM jsonb_object_keys(p_item -> 'links')) > 20
                OR EXISTS (
                    SELECT 1 FROM jsonb_each(p_item -> 'links') l
                    WHERE length(l.key) NOT BETWEEN 1 AND 100
                       OR jsonb_typeof(l.value) <> 'string'
                       OR length(l.value #>> '{}') > 2000
                       OR NOT (l.value #>> '{}') ~* '^https?://[!-~]+$'))
            THEN 'links: up to 20 names (1-100 characters) of http(s) URLs (up to 2000)'
        ELSE NULL
    END
$$;

-- How long after its last refresh a process that reported p_descriptors counts as live: its
-- live_seconds, when that is a number from 0 to 86,400, else 0 (a row written by other means
-- never breaks a reader).
CREATE OR REPLACE FUNCTION awa._live_seconds_v1(p_descriptors jsonb)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT CASE WHEN jsonb_typeof(p_descriptors -> 'live_seconds') = 'number'
                     AND (p_descriptors ->> 'live_seconds')::numeric BETWEEN 0 AND 86400
                THEN (p_descriptors ->> 'live_seconds')::double precision
                ELSE 0 END
$$;

-- Each declared queue and job kind (awa.descriptors) with the live processes that declare it
-- (seen within the live_seconds each reported), how many different declarations they hold,
-- and: stale (no live process declares it) and drift (live processes disagree: a deploy half
-- rolled out). id is what:name.
CREATE OR REPLACE VIEW awa.descriptor_status AS
WITH reported AS (
    SELECT w.what, e.key AS name, e.value AS hash, r.instance_id
    FROM awa.runtime_instances r
    CROSS JOIN LATERAL (VALUES ('queue'), ('kind')) AS w (what)
    CROSS JOIN LATERAL jsonb_each_text(
        CASE WHEN jsonb_typeof(r.descriptors -> w.what) = 'object'
             THEN r.descriptors -> w.what ELSE '{}'::jsonb END) AS e
    WHERE r.descriptors IS NOT NULL
      AND r.last_seen_at > now() - make_interval(secs => awa._live_seconds_v1(r.descriptors))
), agreed AS (
    SELECT x.what, x.name, count(DISTINCT x.instance_id) AS workers,
           count(DISTINCT x.hash) AS versions
    FROM reported x
    GROUP BY x.what, x.name
)
SELECT d.what || ':' || d.name AS id, d.what, d.name, d.label, d.description, d.owner, d.links,
       d.declared_at, d.last_seen_at, COALESCE(a.workers, 0) AS live_workers,
       COALESCE(a.versions, 0) AS versions, a.workers IS NULL AS stale,
       COALESCE(a.versions > 1, false) AS drift
FROM awa.descriptors d
LEFT JOIN agreed a ON a.what = d.what AND a.name = d.name;

-- One worker process's declarations, sent when it starts and on each runtime refresh:
-- p_items is a JSON array of descriptors (awa._descriptor_problem_v1), p_live_seconds how long
-- after its last refresh the process counts as gone. Its row in awa.runtime_instances keeps
-- the hash of each (only rewritten when they change), and awa.descriptors takes each
-- declaration whose hash differs from the one stored (last writer wins; the row's
-- declared_at is then now()), or whose last_seen_at is an hour old. Rows are written in
-- (what, name) order, so that processes reporting at once never deadlock. An invalid item
-- (named by its position), a duplicate, or a bad argument is refused (SQLSTATE 22023) with
-- nothing written. Returns the descriptors written.
CREATE OR REPLACE FUNCTION awa.descriptors_report_v1(
    p_instance uuid, p_live_seconds double precision, p_items jsonb)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_bad record;
    v_hashes jsonb;
    v_n integer;
BEGIN
    IF p_instance IS NULL OR NOT COALESCE(p_live_seconds > 0 AND p_live_seconds <= 86400, false)
       OR jsonb_typeof(p_items) IS DISTINCT FROM 'array' OR jsonb_array_length(p_items) > 10000
    THEN
        RAISE EXCEPTION 'awa: descriptors_report_v1: an instance, 0 < live seconds <= 86400 and '
            'an array of at most 10000 descriptors' USING ERRCODE = '22023';
    END IF;
    SELECT i.ord, awa._descriptor_problem_v1(i.item) AS problem INTO v_bad
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS i (item, ord)
    WHERE awa._descriptor_problem_v1(i.item) IS NOT NULL
    ORDER BY i.ord
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'awa: descriptor %: %', v_bad.ord, v_bad.problem USING ERRCODE = '22023';
    END IF;
    IF (SELECT count(DISTINCT (i ->> 'what', i ->> 'name')) FROM jsonb_array_elements(p_items) i)
       <> jsonb_array_length(p_items) THEN
        RAISE EXCEPTION 'awa: descriptors_report_v1: a queue or kind is declared twice'
            USING ERRCODE = '22023';
    END IF;
    v_hashes := jsonb_build_object(
        'live_seconds', p_live_seconds,
        'queue', COALESCE((SELECT jsonb_object_agg(i ->> 'name', i ->> 'hash')
                           FROM jsonb_array_elements(p_items) i WHERE i ->> 'what' = 'queue'),
                          '{}'::jsonb),
        'kind', COALESCE((SELECT jsonb_object_agg(i ->> 'name', i ->> 'hash')
                          FROM jsonb_array_elements(p_items) i WHERE i ->> 'what' = 'kind'),
                         '{}'::jsonb));
    UPDATE awa.runtime_instances SET descriptors = v_hashes
    WHERE instance_id = p_instance AND descriptors IS DISTINCT FROM v_hashes;
    INSERT INTO awa.descriptors AS d (what, name, label, description, owner, links, hash)
    SELECT i ->> 'what', i ->> 'name', i ->> 'label', i ->> 'description', i ->> 'owner',
           NULLIF(i -> 'links', 'null'::jsonb), i ->> 'hash'
    FROM jsonb_array_elements(p_items) i
    ORDER BY i ->> 'what', i ->> 'name'
    ON CONFLICT (what, name) DO UPDATE
    SET label = excluded.label, description = excluded.description, owner = excluded.owner,
        links = excluded.links, hash = excluded.hash,
        declared_at = CASE WHEN d.hash = excluded.hash THEN d.declared_at ELSE now() END,
        last_seen_at = now()
    WHERE d.hash IS DISTINCT FROM excluded.hash OR d.last_seen_at < now() - interval '1 hour';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- Delete the descriptors no live process declares and none has declared for p_retention
-- seconds (DESCRIPTOR_RETENTION; the maintenance leader's cleanup). Returns how many.
CREATE OR REPLACE FUNCTION awa.descriptors_prune_v1(p_retention double precision)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_n integer;
BEGIN
    IF NOT COALESCE(p_retention > 0 AND p_retention <> 'NaN'::double precision, false) THEN
        RAISE EXCEPTION 'awa: descriptors_prune_v1: retention must be a positive number of seconds'
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM awa.descriptors d
    WHERE d.last_seen_at < now() - make_interval(secs => LEAST(p_retention, awa._max_seconds_v1()))
      AND NOT EXISTS (
          SELECT 1 FROM awa.runtime_instances r
          WHERE r.descriptors -> d.what ? d.name
            AND r.last_seen_at > now() - make_interval(secs => awa._live_seconds_v1(r.descriptors)));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- Kinds of available jobs that no live process declares, with how many of the first 100,000
-- available jobs are of each, most first: "no worker serves it". django.tasks tasks (resolved
-- by path, never declared) are left out, and so is everything when no live process reports
-- its declarations (workers of a version before descriptors).
CREATE OR REPLACE FUNCTION awa.undeclared_kinds_v1()
 RETURNS TABLE(kind text, available bigint)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    WITH live AS (
        SELECT r.descriptors FROM awa.runtime_instances r
        WHERE jsonb_typeof(r.descriptors -> 'kind') = 'object'
          AND r.last_seen_at > now() - make_interval(secs => awa._live_seconds_v1(r.descriptors))
    ), sample AS (
        SELECT j.kind FROM awa.live_jobs j
        WHERE j.state = 'available'
          AND NOT COALESCE(jsonb_typeof(j.args -> 'task') = 'object'
                           AND j.args -> 'task' ? 'backend', false)
          AND EXISTS (SELECT 1 FROM live)
        LIMIT 100000
    )
    SELECT s.kind, count(*) FROM sample s
    WHERE NOT EXISTS (SELECT 1 FROM live l WHERE l.descriptors -> 'kind' ? s.kind)
    GROUP BY s.kind
    ORDER BY count(*) DESC, s.kind
$$;
