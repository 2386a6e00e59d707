"""The contract every part shares: modes, request fields, error types. No torch and no core import, so the client
library, the server and the core all stand on it and on nothing of each other."""
