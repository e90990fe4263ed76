-- Statements used by awa_django.producer.

-- name: enqueue
SELECT job_id, state FROM awa.enqueue_v1(%s::jsonb, %s::jsonb)

-- name: lanes_known
SELECT count(*) FROM awa.queue_lanes WHERE queue = %s AND priority = %s AND shard < 64

-- name: ensure_lanes
SELECT awa.ensure_lanes_v1(%s, %s, %s)

-- name: enqueue_one
SELECT job_id, state FROM awa.enqueue_one_v2(%s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s::jsonb,
    %s::text[], %s, %s, %s, %s, %s)

-- name: enqueue_one_unique
SELECT job_id, state, queue, priority, duplicate
FROM awa.enqueue_one_v3(%s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s::jsonb, %s::text[], %s, %s,
    %s, %s, %s, %s, %s, %s, %s::text[], true)

-- name: copy_allowed
-- Whether the current role may write the ready ring with COPY (an application role with the
-- grants of manage.py awa_roles may not, and enqueues through awa.enqueue_v1 instead).
SELECT has_table_privilege('awa.ready_entries', 'INSERT')

-- name: reserve
SELECT lane_ids, first_seqs, ready_slot, ready_generation, job_ids, db_now
FROM awa.reserve_v1(%s::text[], %s::integer[], %s::integer[], %s)

-- name: copy_ready
COPY awa.ready_entries (ready_slot, ready_generation, lane_id, lane_seq, job_id, priority,
    attempt, max_attempts, run_lease, queue, kind, args, run_at, created_at, deadline_secs,
    metadata, tags) FROM STDIN

-- name: copy_deferred
COPY awa.deferred_jobs (job_id, state, queue, priority, kind, args, attempt, max_attempts,
    run_lease, run_at, created_at, deadline_secs, metadata, tags) FROM STDIN
