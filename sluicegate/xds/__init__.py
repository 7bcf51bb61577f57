"""sluicegate.xds"""
