def check(): pass
class CheckReport: pass
