"""Planning a run before renting the pod: per-device memory from the config alone (`memory`), each host's RAM
(`host`), and the run's real programs compiled from abstract inputs on N fake devices (`compiled`), with the
collectives read from their HLO (`collectives`). `jaxrl plan` prints all of it; nothing here reads weights.
"""
