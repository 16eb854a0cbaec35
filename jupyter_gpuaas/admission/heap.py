"""heapq's functions for the compiled core and simulator, as `Final` names.

Compiled with mypyc, `heapq.heappush(...)` looks the function up as a module attribute at
every call (about 5 M heap operations in a month's replay); a `Final` name is a C static.
"""

from __future__ import annotations

import heapq
from typing import Final

heapify: Final = heapq.heapify
heappop: Final = heapq.heappop
heappush: Final = heapq.heappush
