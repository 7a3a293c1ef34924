-- The body of the plain script's DO block (scripts/sql-edition writes its declarations of the version and
-- the embedded scripts before it): install, upgrade step by step, or nothing, as CREATE EXTENSION would.
  installed text;
  ext_schema text;
  saved_path text := pg_catalog.current_setting('search_path');
  saved_messages text := pg_catalog.current_setting('client_min_messages');
  done_steps text[] := ARRAY[]::text[];
  req text;
  i integer;
  step text;
  e_state text;
  e_message text;
  e_detail text;
  e_hint text;
  e_context text;
BEGIN
  -- One install at a time in this database.
  PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency SQL edition install'));

  IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'idempotency') THEN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pg_tle')
       AND pg_catalog.to_regprocedure('pgtle."idempotency.control"()') IS NOT NULL THEN
      RAISE EXCEPTION 'the pg_tle edition of idempotency is installed in database "%"', pg_catalog.current_database()
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'Upgrade it with idempotency-tle.sql and ALTER EXTENSION idempotency UPDATE; this plain script is for databases without it.';
    END IF;
    RAISE EXCEPTION 'the native idempotency extension is installed in database "%"', pg_catalog.current_database()
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'ALTER EXTENSION idempotency UPDATE upgrades the native extension; the SQL edition replaces it only by the documented move between editions.';
  END IF;

  IF pg_catalog.to_regnamespace('idempotency') IS NOT NULL THEN
    IF pg_catalog.to_regprocedure('idempotency.edition_version()') IS NULL THEN
      RAISE EXCEPTION 'database "%" has a schema idempotency but no SQL edition in it (no idempotency.edition_version())', pg_catalog.current_database()
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'Left over from the native extension or a failed install? Move or drop it first.';
    END IF;
    EXECUTE 'SELECT idempotency.edition_version()' INTO installed;
  END IF;

  IF installed = target_version THEN
    RAISE NOTICE 'idempotency SQL edition % is already installed in database "%": nothing to do', target_version, pg_catalog.current_database();
    RETURN;
  END IF;
  IF installed IS NOT NULL AND NOT installed = ANY (upgrade_from) THEN
    RAISE EXCEPTION 'idempotency SQL edition % is installed in database "%", and this script (%) has no upgrade path from it', installed, pg_catalog.current_database(), target_version
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'A script of a newer release upgrades it; this one does not downgrade.';
  END IF;

  -- As CREATE EXTENSION runs a script: in the first schema of search_path, with only that schema on the
  -- path, and at least WARNING for client messages.
  ext_schema := pg_catalog.current_schema();
  IF ext_schema IS NULL THEN
    RAISE EXCEPTION 'no schema has been selected to create in' USING ERRCODE = 'invalid_schema_name',
      HINT = 'Set search_path to the schema the idem_* functions go to (public by default).';
  END IF;
  FOREACH req IN ARRAY required LOOP
    EXECUTE pg_catalog.format('CREATE EXTENSION IF NOT EXISTS %I', req);
  END LOOP;
  PERFORM pg_catalog.set_config('search_path', pg_catalog.quote_ident(ext_schema), true);
  IF saved_messages NOT IN ('warning', 'error', 'fatal', 'panic') THEN
    PERFORM pg_catalog.set_config('client_min_messages', 'warning', true);
  END IF;

  -- An error inside a script is raised again with its SQLSTATE, message, detail and hint, and the step it
  -- happened in, but without the context PostgreSQL would give it: the whole script.
  BEGIN
  IF installed IS NULL THEN
    step := 'the install of ' || base_version;
    EXECUTE pg_catalog.replace(install_script, '@extschema@', pg_catalog.quote_ident(ext_schema));
    installed := base_version;
    done_steps := done_steps || ('installed ' || base_version);
  END IF;
  WHILE installed <> target_version LOOP
    i := pg_catalog.array_position(upgrade_from, installed);
    step := 'the upgrade from ' || installed || ' to ' || upgrade_to[i];
    EXECUTE pg_catalog.replace(upgrade_script[i], '@extschema@', pg_catalog.quote_ident(ext_schema));
    done_steps := done_steps || (installed || ' to ' || upgrade_to[i]);
    installed := upgrade_to[i];
  END LOOP;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT, e_detail = PG_EXCEPTION_DETAIL,
                            e_hint = PG_EXCEPTION_HINT, e_context = PG_EXCEPTION_CONTEXT;
    e_context := pg_catalog.rtrim(pg_catalog.split_part(e_context, 'SQL statement "', 1), E'\n');
    e_detail := 'In ' || step || ' of the idempotency SQL edition'
               || CASE WHEN e_context <> '' THEN ', at: ' || pg_catalog.replace(e_context, E'\n', '; ') ELSE '' END
               || CASE WHEN e_detail <> '' THEN '. ' || e_detail ELSE '' END;
    IF e_hint <> '' THEN
      RAISE EXCEPTION USING ERRCODE = e_state, MESSAGE = e_message, DETAIL = e_detail, HINT = e_hint;
    END IF;
    RAISE EXCEPTION USING ERRCODE = e_state, MESSAGE = e_message, DETAIL = e_detail;
  END;

  PERFORM pg_catalog.set_config('search_path', saved_path, true);
  PERFORM pg_catalog.set_config('client_min_messages', saved_messages, true);
  EXECUTE 'SELECT idempotency.edition_version()' INTO installed;
  IF installed IS DISTINCT FROM target_version THEN
    RAISE EXCEPTION 'after the install idempotency.edition_version() says %, not %', installed, target_version;
  END IF;
  RAISE NOTICE 'idempotency SQL edition % in database "%", schema %: %', target_version, pg_catalog.current_database(),
    ext_schema, pg_catalog.array_to_string(done_steps, ', ');
END
