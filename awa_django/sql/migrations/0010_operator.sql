-- awa_django migration 0010: what operators and their probes need (issue 18).
--
-- * awa.queue_lag_v1(): per queue, the approximate depth (as awa.queue_depth_v1) and the lag
--   (age of the oldest unclaimed job at the head of any of its lanes), read from the lane
--   cursors and one index probe per lane: never a scan of the ready ring or of history. For
--   health probes (awa_health, the health view) and the metrics' observable gauges.
-- * awa.queue_dlq_v1(queue, enabled): switch a queue's dead letter queue on or off
--   (queue_meta.dlq_enabled, which every failing path already reads).
-- * awa.history_retry_v1(ids, by, queue, priority, retention): retry failed or cancelled jobs
--   from terminal history as new jobs, and awa.history_retries, which records each one (so a
--   job is retried from history at most once while it is there, and who did it).

-- Lag ----------------------------------------------------------------------------------------------

-- One row per queue that has lanes: available (approximate: enqueue sequence minus claim
-- cursor, summed over its lanes; it over-counts briefly, like awa.queue_depth_v1),
-- lag_seconds (now() minus the run_at of the oldest unclaimed, uncancelled job at the head of
-- a lane; NULL when nothing waits) and paused. Each lane costs its cursor, its sequence and one
-- index probe of ready_entries from the cursor on: the head of a lane is its oldest job in
-- lane order, so lag_seconds is the age of the oldest waiting job give or take the FIFO order
-- of lanes (a promoted job is appended when it is promoted, behind jobs enqueued after its
-- run_at).
CREATE FUNCTION awa.queue_lag_v1()
RETURNS TABLE (queue text, available bigint, lag_seconds double precision, paused boolean)
LANGUAGE sql STABLE AS $$
    WITH lanes AS (
        SELECT l.queue, l.lane_id, awa.lane_cursor_v1(l.lane_id) AS cursor,
               COALESCE(pg_sequence_last_value(l.enqueue_seq), 0) AS last_seq
        FROM awa.queue_lanes l
    )
    SELECT x.queue,
           sum(GREATEST(x.last_seq - x.cursor, 0))::bigint,
           extract(epoch FROM now() - min(h.run_at))::double precision,
           COALESCE(bool_or(m.paused), false)
    FROM lanes x
    LEFT JOIN LATERAL (
        SELECT e.run_at FROM awa.ready_entries e
        WHERE x.last_seq > x.cursor AND e.lane_id = x.lane_id AND e.lane_seq > x.cursor
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones t
              WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                AND t.ready_slot = e.ready_slot)
        ORDER BY e.lane_seq
        LIMIT 1
    ) h ON true
    LEFT JOIN awa.queue_meta m ON m.queue = x.queue
    GROUP BY x.queue
    ORDER BY x.queue
$$;
