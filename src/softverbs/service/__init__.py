"""The device service: engines that outlive processes (softverbsd)."""
