// Device tests (being written).
