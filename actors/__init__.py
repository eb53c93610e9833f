"""The actor side: the actor process, its choice of env backend, its policy, heartbeats and replay writers."""
