"""The RDMA connection manager: rdma_cm and ib_cm in the device, librdmacm above.

Theory of operation
-------------------
The kernel splits RDMA CM in two, and softverbs does too:

* **In the device** (:mod:`.agent`, :mod:`.gsi`, :mod:`.mad`) -- what the
  kernel's ``rdma_cm``/``ib_cm`` modules do: port spaces and listeners,
  address and route resolution over the device's IP addresses, and the IBTA
  CM protocol -- REQ, REP, RTU, REJ, MRA, DREQ, DREP, and SIDR_REQ/SIDR_REP
  for UD -- as 256-byte MADs sent as UD SEND_ONLY packets to QP1 (Q_Key
  0x80010000), with retransmissions and timeouts.  QP1 is a real UD QP in
  the device's QP table.  An embedded device runs its agent in the
  application's process; a served device runs it in ``softverbsd``, where
  every process using the device meets the same agent, as every process on a
  host meets the kernel's.
* **In the application** (:mod:`.api`) -- what librdmacm does: CM IDs,
  event channels, synchronous endpoints, and the QP transitions that follow
  the handshake.  :mod:`.kernel` is the "/dev/infiniband/rdma_cm" between
  the two: direct calls, or messages on the service socket.

``pyverbs.cmid`` (under ``softverbs exec``) is :mod:`.api`.

The package itself imports nothing: :mod:`.agent` and the modules below it
are the device half, which must not depend on the user half (:mod:`.api`,
:mod:`.kernel`) above them; a facade here would make every
``from softverbs.cm import mad`` in the agent import the user half too.
"""
