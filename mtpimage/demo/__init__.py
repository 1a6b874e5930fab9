"""The loopback world: what the real stack needs from outside (GitHub, a registry, a base
pinned by digest), made on this machine by the code the end-to-end tests use.

    gitrepos.py   small, deterministic git repositories standing in for the upstreams
    gitserver.py  a git daemon serving them, and the git config that sends github.com there
    registry.py   a registry of its own on a free loopback port (distribution's binary)
    testbase.py   the local Debian base image, pushed there so it has a registry digest
"""
