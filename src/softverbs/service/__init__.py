"""The device service, ``softverbsd``: engines that outlive processes.

:mod:`softverbs.service.server` is the service; ``python -m softverbs.service``
starts it (:func:`softverbs.config.service_command`).  Its clients reach it
through the served provider (:mod:`softverbs.verbs.served`) or the C library,
both speaking :mod:`softverbs.device.protocol`.
"""
