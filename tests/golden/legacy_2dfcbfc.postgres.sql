--
-- PostgreSQL database dump
--

\restrict QDIYEVZu4hV9TJXmdsNLi1CfNKWIPRRixhmTSFkML0x7hJUQSDEPcSfTZW9Qg4G

-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: {schema}; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA {schema};


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: tether_approval_audit; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_approval_audit (
    approval_id text NOT NULL,
    seq integer NOT NULL,
    at double precision NOT NULL,
    event text NOT NULL,
    actor text,
    detail text NOT NULL,
    prev_hash text NOT NULL,
    hash text NOT NULL
);


--
-- Name: tether_approvals; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_approvals (
    id text NOT NULL,
    run_id text NOT NULL,
    step text NOT NULL,
    status text NOT NULL,
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    audit_count integer NOT NULL,
    audit_head text NOT NULL,
    body text NOT NULL
);


--
-- Name: tether_checkpoints; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_checkpoints (
    run_id text NOT NULL,
    seq integer NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    status text NOT NULL,
    result text,
    error text,
    attempts integer DEFAULT 0 NOT NULL,
    started_at double precision,
    finished_at double precision,
    retry_at double precision,
    "position" text,
    args text
);


--
-- Name: tether_events; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_events (
    id bigint NOT NULL,
    run_id text NOT NULL,
    key text NOT NULL,
    payload text NOT NULL,
    created_at double precision NOT NULL,
    consumed_by text,
    consumed_at double precision
);


--
-- Name: tether_events_id_seq; Type: SEQUENCE; Schema: {schema}; Owner: -
--

CREATE SEQUENCE {schema}.tether_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: tether_events_id_seq; Type: SEQUENCE OWNED BY; Schema: {schema}; Owner: -
--

ALTER SEQUENCE {schema}.tether_events_id_seq OWNED BY {schema}.tether_events.id;


--
-- Name: tether_forks; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_forks (
    run_id text NOT NULL,
    source_run_id text NOT NULL,
    from_step text NOT NULL,
    from_seq integer NOT NULL,
    created_at double precision NOT NULL
);


--
-- Name: tether_migrations; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_migrations (
    version integer NOT NULL,
    applied_at double precision NOT NULL
);


--
-- Name: tether_outbox; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_outbox (
    id text NOT NULL,
    run_id text NOT NULL,
    checkpoint text NOT NULL,
    destination text NOT NULL,
    key text NOT NULL,
    payload text NOT NULL,
    status text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    uncertain integer DEFAULT 0 NOT NULL,
    in_doubt boolean DEFAULT false NOT NULL,
    claims integer DEFAULT 0 NOT NULL,
    claimed_by text,
    next_at double precision NOT NULL,
    error text,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    delivered_at double precision
);


--
-- Name: tether_runs; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_runs (
    id text NOT NULL,
    workflow text NOT NULL,
    status text NOT NULL,
    args text NOT NULL,
    result text,
    error text,
    owner text,
    epoch bigint DEFAULT 0 NOT NULL,
    lease_expires_at double precision,
    wake_at double precision,
    deadline_at double precision,
    cancel_requested boolean DEFAULT false NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    finished_at double precision,
    parent_id text,
    wake_on text,
    queue text,
    priority integer DEFAULT 0 NOT NULL,
    dedup_key text,
    started_at double precision,
    started_by text,
    failures integer DEFAULT 0 NOT NULL
);


--
-- Name: tether_schedules; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_schedules (
    name text NOT NULL,
    workflow text NOT NULL,
    cron text NOT NULL,
    tz text NOT NULL,
    catch_up text NOT NULL,
    last_slot double precision NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);


--
-- Name: tether_stream_entries; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_stream_entries (
    run_id text NOT NULL,
    key text NOT NULL,
    "offset" bigint NOT NULL,
    kind text NOT NULL,
    data text NOT NULL,
    writer text NOT NULL,
    attempt integer NOT NULL,
    ref text,
    created_at double precision NOT NULL
);


--
-- Name: tether_streams; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_streams (
    run_id text NOT NULL,
    key text NOT NULL,
    next_offset bigint NOT NULL
);


--
-- Name: tether_users; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_users (
    name text NOT NULL,
    groups text NOT NULL,
    token_hash text NOT NULL,
    created_at double precision NOT NULL,
    revoked_at double precision
);


--
-- Name: tether_values; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_values (
    run_id text NOT NULL,
    key text NOT NULL,
    version bigint NOT NULL,
    value text NOT NULL,
    seq integer NOT NULL,
    created_at double precision NOT NULL
);


--
-- Name: tether_workers; Type: TABLE; Schema: {schema}; Owner: -
--

CREATE TABLE {schema}.tether_workers (
    id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    pid_token text NOT NULL,
    started_at double precision NOT NULL,
    heartbeat_at double precision NOT NULL,
    workflows text,
    boot_id text,
    pid_ns text
);


--
-- Name: tether_events id; Type: DEFAULT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_events ALTER COLUMN id SET DEFAULT nextval('{schema}.tether_events_id_seq'::regclass);


--
-- Data for Name: tether_approval_audit; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_approvals; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_checkpoints; Type: TABLE DATA; Schema: {schema}; Owner: -
--

INSERT INTO {schema}.tether_checkpoints VALUES ('legacy-done', 0, 'add', 'step', 'completed', '15', NULL, 1, 1796181729.5218728, 1796181729.5219958, NULL, '0', '{"args":[5,10],"kwargs":{}}');
INSERT INTO {schema}.tether_checkpoints VALUES ('legacy-waiting', 0, 'add', 'step', 'completed', '2', NULL, 1, 1796181729.5338614, 1796181729.5338783, NULL, '0', '{"args":[1,1],"kwargs":{}}');
INSERT INTO {schema}.tether_checkpoints VALUES ('legacy-waiting', 1, 'add#2', 'step', 'completed', '4', NULL, 1, 1796181729.5351584, 1796181729.5351806, NULL, '1', '{"args":[2,2],"kwargs":{}}');
INSERT INTO {schema}.tether_checkpoints VALUES ('legacy-waiting', 2, 'event:go', 'event', 'started', NULL, NULL, 1, 1796181729.536537, NULL, 1827717729.536537, '2', NULL);
INSERT INTO {schema}.tether_checkpoints VALUES ('legacy-early-event', 0, 'add', 'step', 'completed', '101', NULL, 1, 1796181731.5648372, 1796181731.5648587, NULL, '0', '{"args":[100,1],"kwargs":{}}');
INSERT INTO {schema}.tether_checkpoints VALUES ('legacy-early-event', 1, 'add#2', 'step', 'completed', '103', NULL, 1, 1796181731.5656548, 1796181731.5656717, NULL, '1', '{"args":[101,2],"kwargs":{}}');
INSERT INTO {schema}.tether_checkpoints VALUES ('legacy-early-event', 2, 'event:go', 'event', 'completed', '{"key":"go","value":7}', NULL, 1, 1796181731.5667405, 1796181731.8680577, NULL, '2', NULL);
INSERT INTO {schema}.tether_checkpoints VALUES ('legacy-early-event', 3, 'add#3', 'step', 'completed', '110', NULL, 1, 1796181731.8716362, 1796181731.8716538, NULL, '3', '{"args":[103,7],"kwargs":{}}');


--
-- Data for Name: tether_events; Type: TABLE DATA; Schema: {schema}; Owner: -
--

INSERT INTO {schema}.tether_events VALUES (1, 'legacy-early-event', 'go', '7', 1796181731.8649995, 'event:go', 1796181731.8680825);


--
-- Data for Name: tether_forks; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_migrations; Type: TABLE DATA; Schema: {schema}; Owner: -
--

INSERT INTO {schema}.tether_migrations VALUES (1, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (2, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (3, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (4, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (5, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (6, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (7, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (8, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (9, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (10, 1796181729.464773);
INSERT INTO {schema}.tether_migrations VALUES (11, 1796181729.464773);


--
-- Data for Name: tether_outbox; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_runs; Type: TABLE DATA; Schema: {schema}; Owner: -
--

INSERT INTO {schema}.tether_runs VALUES ('legacy-done', 'finished', 'succeeded', '{"args":[5],"kwargs":{}}', '15', NULL, NULL, 1, NULL, NULL, NULL, false, 1796181729.5141757, 1796181729.5297081, 1796181729.5297081, NULL, NULL, NULL, 0, NULL, 1796181729.5141757, NULL, 0);
INSERT INTO {schema}.tether_runs VALUES ('legacy-waiting', 'legacy', 'waiting', '{"args":[1],"kwargs":{}}', NULL, NULL, NULL, 1, NULL, 1827717729.536537, NULL, false, 1796181729.5325725, 1796181731.5382829, NULL, NULL, '["go"]', NULL, 0, NULL, 1796181729.5325725, NULL, 0);
INSERT INTO {schema}.tether_runs VALUES ('legacy-early-event', 'legacy', 'succeeded', '{"args":[100],"kwargs":{}}', '110', NULL, NULL, 1, NULL, NULL, NULL, false, 1796181731.56337, 1796181731.8723605, 1796181731.8723605, NULL, NULL, NULL, 0, NULL, 1796181731.56337, NULL, 0);


--
-- Data for Name: tether_schedules; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_stream_entries; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_streams; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_users; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_values; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Data for Name: tether_workers; Type: TABLE DATA; Schema: {schema}; Owner: -
--



--
-- Name: tether_events_id_seq; Type: SEQUENCE SET; Schema: {schema}; Owner: -
--

SELECT pg_catalog.setval('{schema}.tether_events_id_seq', 1, true);


--
-- Name: tether_approval_audit tether_approval_audit_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_approval_audit
    ADD CONSTRAINT tether_approval_audit_pkey PRIMARY KEY (approval_id, seq);


--
-- Name: tether_approvals tether_approvals_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_approvals
    ADD CONSTRAINT tether_approvals_pkey PRIMARY KEY (id);


--
-- Name: tether_checkpoints tether_checkpoints_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_checkpoints
    ADD CONSTRAINT tether_checkpoints_pkey PRIMARY KEY (run_id, seq);


--
-- Name: tether_events tether_events_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_events
    ADD CONSTRAINT tether_events_pkey PRIMARY KEY (id);


--
-- Name: tether_forks tether_forks_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_forks
    ADD CONSTRAINT tether_forks_pkey PRIMARY KEY (run_id);


--
-- Name: tether_migrations tether_migrations_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_migrations
    ADD CONSTRAINT tether_migrations_pkey PRIMARY KEY (version);


--
-- Name: tether_outbox tether_outbox_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_outbox
    ADD CONSTRAINT tether_outbox_pkey PRIMARY KEY (id);


--
-- Name: tether_runs tether_runs_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_runs
    ADD CONSTRAINT tether_runs_pkey PRIMARY KEY (id);


--
-- Name: tether_schedules tether_schedules_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_schedules
    ADD CONSTRAINT tether_schedules_pkey PRIMARY KEY (name);


--
-- Name: tether_stream_entries tether_stream_entries_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_stream_entries
    ADD CONSTRAINT tether_stream_entries_pkey PRIMARY KEY (run_id, key, "offset");


--
-- Name: tether_streams tether_streams_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_streams
    ADD CONSTRAINT tether_streams_pkey PRIMARY KEY (run_id, key);


--
-- Name: tether_users tether_users_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_users
    ADD CONSTRAINT tether_users_pkey PRIMARY KEY (name);


--
-- Name: tether_users tether_users_token_hash_key; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_users
    ADD CONSTRAINT tether_users_token_hash_key UNIQUE (token_hash);


--
-- Name: tether_values tether_values_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_values
    ADD CONSTRAINT tether_values_pkey PRIMARY KEY (run_id, key, version);


--
-- Name: tether_workers tether_workers_pkey; Type: CONSTRAINT; Schema: {schema}; Owner: -
--

ALTER TABLE ONLY {schema}.tether_workers
    ADD CONSTRAINT tether_workers_pkey PRIMARY KEY (id);


--
-- Name: tether_approvals_run; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_approvals_run ON {schema}.tether_approvals USING btree (run_id);


--
-- Name: tether_approvals_status; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_approvals_status ON {schema}.tether_approvals USING btree (status, created_at);


--
-- Name: tether_approvals_updated; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_approvals_updated ON {schema}.tether_approvals USING btree (updated_at, id);


--
-- Name: tether_events_mailbox; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_events_mailbox ON {schema}.tether_events USING btree (run_id, key, id) WHERE (consumed_by IS NULL);


--
-- Name: tether_events_run; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_events_run ON {schema}.tether_events USING btree (run_id);


--
-- Name: tether_forks_source; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_forks_source ON {schema}.tether_forks USING btree (source_run_id, created_at);


--
-- Name: tether_outbox_due; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_outbox_due ON {schema}.tether_outbox USING btree (status, next_at);


--
-- Name: tether_outbox_run; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_outbox_run ON {schema}.tether_outbox USING btree (run_id);


--
-- Name: tether_runs_created; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_runs_created ON {schema}.tether_runs USING btree (created_at);


--
-- Name: tether_runs_dedup; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE UNIQUE INDEX tether_runs_dedup ON {schema}.tether_runs USING btree (COALESCE(queue, ''::text), dedup_key) WHERE ((dedup_key IS NOT NULL) AND (status = ANY (ARRAY['pending'::text, 'running'::text, 'waiting'::text, 'held'::text])));


--
-- Name: tether_runs_due; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_runs_due ON {schema}.tether_runs USING btree (status, wake_at);


--
-- Name: tether_runs_finished; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_runs_finished ON {schema}.tether_runs USING btree (finished_at, id) WHERE (finished_at IS NOT NULL);


--
-- Name: tether_runs_lease; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_runs_lease ON {schema}.tether_runs USING btree (status, lease_expires_at);


--
-- Name: tether_runs_owner; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_runs_owner ON {schema}.tether_runs USING btree (owner) WHERE (owner IS NOT NULL);


--
-- Name: tether_runs_parent; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_runs_parent ON {schema}.tether_runs USING btree (parent_id) WHERE (parent_id IS NOT NULL);


--
-- Name: tether_runs_queue; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_runs_queue ON {schema}.tether_runs USING btree (queue, status) WHERE (queue IS NOT NULL);


--
-- Name: tether_stream_refs; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE UNIQUE INDEX tether_stream_refs ON {schema}.tether_stream_entries USING btree (run_id, key, ref) WHERE (ref IS NOT NULL);


--
-- Name: tether_stream_writers; Type: INDEX; Schema: {schema}; Owner: -
--

CREATE INDEX tether_stream_writers ON {schema}.tether_stream_entries USING btree (run_id, key, writer);


--
-- PostgreSQL database dump complete
--

\unrestrict QDIYEVZu4hV9TJXmdsNLi1CfNKWIPRRixhmTSFkML0x7hJUQSDEPcSfTZW9Qg4G

