-- Changes to the tables since the settled schema was first written (before 0.1.0), for a
-- database whose tables an earlier development version created: on one that tables.sql created,
-- each statement does nothing. Folded into tables.sql, and this file emptied, at the release.

-- Whose installation the schema is (awa_django.db.migration: one schema, one project).
ALTER TABLE awa.schema_migrations ADD COLUMN IF NOT EXISTS installed_for text;

-- A callback extension that arrives before the attempt parks is kept for its wait.
ALTER TABLE awa.attempt_state ADD COLUMN IF NOT EXISTS callback_extend_to timestamptz;

-- The per-minute roll-up of each queue that the admin's queue charts read.
CREATE TABLE IF NOT EXISTS awa.queue_minutes (
    queue text NOT NULL,
    minute timestamptz NOT NULL,
    completed integer NOT NULL,
    failed integer NOT NULL,
    cancelled integer NOT NULL,
    dead_lettered integer NOT NULL,
    wait_p50 double precision,
    wait_p95 double precision,
    run_p50 double precision,
    run_p95 double precision,
    available bigint,
    retryable bigint,
    oldest_seconds double precision,
    recounted boolean NOT NULL DEFAULT false,
    PRIMARY KEY (queue, minute)
);
ALTER TABLE awa.queue_minutes ADD COLUMN IF NOT EXISTS recounted boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS queue_minutes_minute_idx ON awa.queue_minutes (minute);
ALTER TABLE awa.queue_minutes ADD COLUMN IF NOT EXISTS retried integer NOT NULL DEFAULT 0;

-- Retries per minute in the queue charts: when a retryable row's attempt failed, and the
-- retries promotion has moved back to the queue.
ALTER TABLE awa.deferred_jobs ADD COLUMN IF NOT EXISTS deferred_at timestamptz NOT NULL
    DEFAULT now();
CREATE INDEX IF NOT EXISTS deferred_jobs_retried_idx ON awa.deferred_jobs (queue, deferred_at)
    WHERE state = 'retryable';
CREATE TABLE IF NOT EXISTS awa.queue_minute_retries (
    queue text NOT NULL,
    minute timestamptz NOT NULL,
    retries integer NOT NULL,
    PRIMARY KEY (queue, minute)
);

-- Descriptors: the queues and job kinds declared in code, and what each process declares.
ALTER TABLE awa.runtime_instances ADD COLUMN IF NOT EXISTS descriptors jsonb;
CREATE TABLE IF NOT EXISTS awa.descriptors (
    what text NOT NULL CHECK (what IN ('queue', 'kind')),
    name text NOT NULL,
    label text,
    description text,
    owner text,
    links jsonb,
    hash text NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (what, name)
);
