-- Runs once, when the data volume is first initialised (POSTGRES_DB already made `utxo`).
-- The state store gets its own database: small and hot (leases, the tip), it can move to
-- another server by changing UTXO_STATE_URL alone, and it is backed up apart from the big one.
CREATE DATABASE utxo_state;
