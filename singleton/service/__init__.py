"""The service layer: configuration, the ``singleton`` command, one replica hosting listeners
under electors, the registry of backends and listeners, metrics, status, logs, the embedded
development servers, the demo and the failover drill.

It composes the core (:mod:`singleton`) and the listeners (:mod:`listeners`), and it is the only
layer that reads the environment.
"""
