"""Imported last by the forkserver the step processes are forked from (jobs.FORKSERVER): what the
server has loaded is moved out of the garbage collector's sight.

A forked step inherits the server's heap (the definitions, Dagster, pandas, pyarrow: hundreds of
thousands of objects). Its first full collections would traverse all of it, writing to every
object and so copying every page the fork shared: half of a short step's CPU. Frozen objects are
never traversed (gc.freeze, made for servers that fork); the garbage of the imports is collected
first so that none of it is kept for good.
"""

import gc

gc.collect()
gc.freeze()
