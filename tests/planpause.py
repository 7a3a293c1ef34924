"""tests/planpause.c built for the server that pg_config names (its headers), for a test session to LOAD
(a superuser's): see that file for what it does."""
import pathlib
import subprocess

import cbuild
import pgtools

SOURCE = pathlib.Path(__file__).resolve().parent / "planpause.c"


def library():
    """The module's path, built once per content of the source and per server's headers."""
    include = subprocess.run([str(pgtools.pg().pg_config), "--includedir-server"], capture_output=True, text=True,
                             check=True).stdout.strip()
    # (-fwrapv and -fno-strict-aliasing, as PostgreSQL itself is compiled)
    return cbuild.shared_library(SOURCE, "/tmp/idem-planpause", "planpause",
                                 ["-fwrapv", "-fno-strict-aliasing", f"-I{include}"])
