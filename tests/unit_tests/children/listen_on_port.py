"""Child program: listen on the TCP port given as the only argument, then exit (a rendezvous stand-in)."""

import socket
import sys

with socket.socket() as server:
    server.bind(("127.0.0.1", int(sys.argv[1])))  # fails with "Address already in use" if it is taken
    server.listen()
print("listened", flush=True)
