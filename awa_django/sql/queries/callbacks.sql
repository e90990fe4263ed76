-- Statements of external callbacks (awa_django.callbacks and the callback actions of
-- awa_django.operator), on Django's connection, in a transaction at READ COMMITTED.

-- name: callback_receive
-- One signed request of the HTTP receiver: (outcome, replayed, timeout_at).
SELECT outcome, replayed, timeout_at
FROM awa.callback_receive_v1(%s::uuid, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s, %s)

-- name: callback_resolve_v2
-- awa_django.resolve_callback: (outcome, job_id, run_lease).
SELECT outcome, job_id, run_lease
FROM awa.callback_resolve_v2(%s::uuid, %s::jsonb, %s::jsonb, %s, %s)

-- name: callback_extend
-- awa_django.extend_callback: (outcome, timeout_at).
SELECT outcome, timeout_at FROM awa.callback_extend_v1(%s::uuid, %s)

-- name: callback_receipts_prune
SELECT awa.callback_receipts_prune_v1(%s, %s)
