"""The stream path: long text planned into chunks lazily, and the scheduler that synthesizes
them ahead in a small window and sends them strictly in order."""
