"""Operations: status, lag and the monitor's rules, from the ledger and the watermarks."""
