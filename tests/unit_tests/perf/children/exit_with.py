"""A stand-in launcher that prints one line and exits with the code given as its argument."""

import sys

print("launcher: exiting with", sys.argv[1], flush=True)
sys.exit(int(sys.argv[1]))
